"""SQS errors: AWS's codes, HTTP statuses and the legacy query codes (x-amzn-query-error)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ErrorKind:
    code: str  # JSON protocol: the __type suffix (e.g. QueueDoesNotExist)
    status: int
    query_code: str  # query protocol code, also sent as x-amzn-query-error
    sender_fault: bool = True


def _kind(
    code: str, status: int = 400, query_code: str | None = None, sender: bool = True
) -> ErrorKind:
    return ErrorKind(code, status, query_code or code, sender)


KINDS: dict[str, ErrorKind] = {
    k.code: k
    for k in (
        _kind("QueueDoesNotExist", 400, "AWS.SimpleQueueService.NonExistentQueue"),
        _kind("QueueNameExists", 400, "QueueAlreadyExists"),
        _kind("QueueDeletedRecently", 400, "AWS.SimpleQueueService.QueueDeletedRecently"),
        _kind("InvalidAttributeName"),
        _kind("InvalidAttributeValue"),
        _kind("InvalidParameterValue", 400, "InvalidParameterValue"),
        _kind("MissingParameter", 400, "MissingParameter"),
        _kind("InvalidMessageContents"),
        _kind("InvalidIdFormat"),
        _kind("ReceiptHandleIsInvalid"),
        _kind("MessageNotInflight", 400, "AWS.SimpleQueueService.MessageNotInflight"),
        _kind("PurgeQueueInProgress", 403, "AWS.SimpleQueueService.PurgeQueueInProgress"),
        _kind("OverLimit", 403, "OverLimit"),
        _kind("EmptyBatchRequest", 400, "AWS.SimpleQueueService.EmptyBatchRequest"),
        _kind(
            "TooManyEntriesInBatchRequest",
            400,
            "AWS.SimpleQueueService.TooManyEntriesInBatchRequest",
        ),
        _kind("BatchEntryIdsNotDistinct", 400, "AWS.SimpleQueueService.BatchEntryIdsNotDistinct"),
        _kind("BatchRequestTooLong", 400, "AWS.SimpleQueueService.BatchRequestTooLong"),
        _kind("InvalidBatchEntryId", 400, "AWS.SimpleQueueService.InvalidBatchEntryId"),
        _kind("UnsupportedOperation", 400, "AWS.SimpleQueueService.UnsupportedOperation"),
        _kind("InvalidAction", 400, "InvalidAction"),
        _kind("InvalidSecurity", 403, "InvalidSecurity"),
        _kind("InvalidClientTokenId", 403, "InvalidClientTokenId"),
        _kind("SignatureDoesNotMatch", 403, "SignatureDoesNotMatch"),
        _kind("MissingAuthenticationToken", 403, "MissingAuthenticationToken"),
        _kind("IncompleteSignature", 400, "IncompleteSignature"),
        _kind("RequestExpired", 400, "RequestExpired"),
        _kind("ResourceNotFoundException", 404, "ResourceNotFoundException"),
        _kind("ServiceUnavailable", 503, "ServiceUnavailable", sender=False),
        _kind("InternalError", 500, "InternalError", sender=False),
        _kind("RequestThrottled", 403, "RequestThrottled"),
    )
}


class SqsError(Exception):
    """An error to answer in AWS's words. `code` must be a key of KINDS."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.kind = KINDS[code]
        self.message = message
