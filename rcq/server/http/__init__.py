"""The HTTP API v1: pydantic wire models (``models``), the verbs shared by the routes and
``/v1/batch`` (``operations``), the routes and the error middleware (``api``). Thin: parse,
validate, call the transaction manager, map errors to status codes.
"""
