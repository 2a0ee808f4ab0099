"""The Amazon SQS wire API over dirmq queues, so boto3, the AWS CLI and other SQS clients work
unchanged against `dirmq serve` (same port as the native API, or `--sqs-listen`).

    protocol_json.py   AWS JSON 1.0 (X-Amz-Target: AmazonSQS.<Action>), errors with
                       x-amzn-query-error
    protocol_query.py  the query protocol (form-encoded Action=..., XML answers), driven by
                       botocore's SQS service model
    app.py             detects SQS requests, authorises (access.py), dispatches to an action
    auth.py            AWS Signature V4: which principal's key signed a request
    access.py          the permission each action needs, on which queue
    context.py         what an action needs: the broker, the account, queue URLs and ARNs
    errors.py          SQS error codes, their HTTP statuses and query-compatible codes
    actions/           one module per group of actions, each action (context, params) -> result,
                       with params and result shaped as in the JSON protocol
"""
