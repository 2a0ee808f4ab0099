"""SQS errors: AWS's codes, HTTP statuses and the legacy query codes (x-amzn-query-error).

Each error has three names, as AWS answers it:

- `code`: how actions raise it (`SqsError("QueueDoesNotExist", ...)`), and the JSON protocol's
  `__type` unless `json_code` says otherwise (AWS's InvalidParameterValue is
  `InvalidParameterValueException` on the JSON side);
- `query_code`: the query protocol's `<Code>` and the JSON protocol's `x-amzn-query-error`
  header, which botocore (SQS is "awsQueryCompatible") reports as `Error.Code`.
"""

from __future__ import annotations

from dataclasses import dataclass

SQS_NAMESPACE = "com.amazonaws.sqs"
CORAL_NAMESPACE = "com.amazon.coral.service"  # errors of AWS's front end, not of SQS itself


@dataclass(frozen=True, slots=True)
class ErrorKind:
    code: str
    status: int
    query_code: str
    sender_fault: bool = True
    json_code: str = ""  # JSON `__type` suffix; empty: `code`
    namespace: str = SQS_NAMESPACE  # JSON `__type` prefix
    query_header: bool = True  # send x-amzn-query-error (front-end errors do not)
    # AWS words some errors differently in the query protocol: (JSON wording, query wording).
    query_wording: tuple[str, str] = ("", "")

    @property
    def json_type(self) -> str:
        return f"{self.namespace}#{self.json_code or self.code}"


def _kind(
    code: str,
    status: int = 400,
    query_code: str | None = None,
    sender: bool = True,
    *,
    json_code: str = "",
    front_end: bool = False,
    query_wording: tuple[str, str] = ("", ""),
) -> ErrorKind:
    return ErrorKind(
        code,
        status,
        query_code or code,
        sender,
        json_code,
        CORAL_NAMESPACE if front_end else SQS_NAMESPACE,
        not front_end,
        query_wording,
    )


_SQS = "AWS.SimpleQueueService."

KINDS: dict[str, ErrorKind] = {
    k.code: k
    for k in (
        _kind(
            "QueueDoesNotExist",
            400,
            _SQS + "NonExistentQueue",
            query_wording=(
                "The specified queue does not exist.",
                "The specified queue does not exist for this wsdl version.",
            ),
        ),
        _kind("QueueNameExists", 400, "QueueAlreadyExists"),
        _kind("QueueDeletedRecently", 400, _SQS + "QueueDeletedRecently"),
        _kind("InvalidAttributeName"),
        _kind("InvalidAttributeValue"),
        _kind(
            "InvalidParameterValue",
            400,
            "InvalidParameterValue",
            json_code="InvalidParameterValueException",
        ),
        _kind(
            "MissingParameter",
            400,
            "MissingParameter",
            json_code="MissingRequiredParameterException",
        ),
        _kind("InvalidMessageContents"),
        _kind("InvalidIdFormat"),
        _kind("ReceiptHandleIsInvalid"),
        _kind("MessageNotInflight", 400, _SQS + "MessageNotInflight"),
        _kind("PurgeQueueInProgress", 403, _SQS + "PurgeQueueInProgress"),
        _kind("OverLimit", 403, "OverLimit"),
        _kind("EmptyBatchRequest", 400, _SQS + "EmptyBatchRequest"),
        _kind("TooManyEntriesInBatchRequest", 400, _SQS + "TooManyEntriesInBatchRequest"),
        _kind("BatchEntryIdsNotDistinct", 400, _SQS + "BatchEntryIdsNotDistinct"),
        _kind("BatchRequestTooLong", 400, _SQS + "BatchRequestTooLong"),
        _kind("InvalidBatchEntryId", 400, _SQS + "InvalidBatchEntryId"),
        _kind("UnsupportedOperation", 400, _SQS + "UnsupportedOperation"),
        _kind("InvalidAction", 400, "InvalidAction"),
        _kind("InvalidSecurity", 403, "InvalidSecurity"),
        # A known principal without the permission (AWS: IAM's refusal, from its front end,
        # reported as AccessDenied by the query-compatible header).
        ErrorKind(
            "AccessDenied", 403, "AccessDenied", True, "AccessDeniedException", CORAL_NAMESPACE
        ),
        _kind("InvalidClientTokenId", 403, "InvalidClientTokenId"),
        _kind("SignatureDoesNotMatch", 403, "SignatureDoesNotMatch"),
        _kind("MissingAuthenticationToken", 403, "MissingAuthenticationToken"),
        _kind("IncompleteSignature", 400, "IncompleteSignature"),
        _kind("RequestExpired", 400, "RequestExpired"),
        _kind("ResourceNotFoundException", 404, "ResourceNotFoundException"),
        _kind("ServiceUnavailable", 503, "ServiceUnavailable", sender=False),
        _kind("InternalError", 500, "InternalError", sender=False),
        _kind("RequestThrottled", 403, "RequestThrottled"),
        # The JSON protocol's own complaints (AWS's front end answers these, in its namespace).
        _kind("UnknownOperationException", 400, "InvalidAction", front_end=True),
        _kind("SerializationException", 400, "MalformedInput", front_end=True),
        # The query protocol's.
        _kind("MalformedQueryString", 400, "MalformedQueryString"),
    )
}


class SqsError(Exception):
    """An error to answer in AWS's words. `code` must be a key of KINDS."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.kind = KINDS[code]
        self.message = message

    @property
    def query_message(self) -> str:
        json_wording, query_wording = self.kind.query_wording
        return query_wording if json_wording and self.message == json_wording else self.message


def missing(parameter: str) -> SqsError:
    return SqsError("MissingParameter", f"The request must contain the parameter {parameter}.")


def invalid_value(parameter: str, value: object, reason: str) -> SqsError:
    """AWS's usual InvalidParameterValue wording."""
    return SqsError(
        "InvalidParameterValue",
        f"Value {value} for parameter {parameter} is invalid. Reason: {reason}",
    )


def no_such_queue() -> SqsError:
    return SqsError("QueueDoesNotExist", "The specified queue does not exist.")


def not_an_sqs_name(name: str) -> SqsError:
    """A queue that exists under a name SQS cannot spell. Still QueueDoesNotExist (the code
    SQS clients test for, e.g. boto3's `QueueDoesNotExist` exception): only the words differ."""
    return SqsError(
        "QueueDoesNotExist",
        f"The queue {name!r} exists, but its name is not a valid SQS queue name (1-80 "
        "characters of A-Z, a-z, 0-9, _ and -, and a .fifo suffix for a FIFO queue), so SQS "
        "cannot reach it: use dirmq's native API for it, or a queue whose name SQS can spell.",
    )
