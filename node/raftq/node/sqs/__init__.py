"""The SQS-compatible endpoint (``--sqs-listen``): see ``frontend`` and the node DESIGN.md."""
