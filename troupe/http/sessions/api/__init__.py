"""The unified ``/api`` surface of the sessions listener: a second transport, in the dialect
of the real tansr SDK, in front of the same session actors as ``/v2`` (see ``_app_api``)."""

from ._app_api import (
    ApiFacade,
    ApiGate,
    body_caps_by_operation,
    create_api_app,
    current_closure,
    install_api,
    is_unified_request,
    match_api_operation,
    served_operations,
)
from ._discovery import (
    closure_document,
    deployment_capabilities,
    operation_states,
    session_family_discovery,
)
from ._events import envelope_frame, event_envelope, terminal_status
from ._manifest import ApiOperation, api_operations, api_operations_by_name, manifest_document
from ._routes_core import ApiAdmission, api_admission, export_document, import_bytes, make_api_ask
from ._transport import (
    ApiHeaderError,
    ApiRequestHeaders,
    api_bytes_response,
    api_empty_response,
    api_error_response,
    api_json_response,
    error_document,
    parse_api_request_headers,
    parse_headers,
    session_error_response,
    unified_headers,
)

__all__ = [
    "ApiAdmission",
    "ApiFacade",
    "ApiGate",
    "ApiHeaderError",
    "ApiOperation",
    "ApiRequestHeaders",
    "api_admission",
    "api_bytes_response",
    "api_empty_response",
    "api_error_response",
    "api_json_response",
    "api_operations",
    "api_operations_by_name",
    "body_caps_by_operation",
    "closure_document",
    "create_api_app",
    "current_closure",
    "deployment_capabilities",
    "envelope_frame",
    "error_document",
    "event_envelope",
    "export_document",
    "import_bytes",
    "install_api",
    "is_unified_request",
    "make_api_ask",
    "manifest_document",
    "match_api_operation",
    "operation_states",
    "parse_api_request_headers",
    "parse_headers",
    "served_operations",
    "session_error_response",
    "session_family_discovery",
    "terminal_status",
    "unified_headers",
]
