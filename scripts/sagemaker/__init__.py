"""SageMaker: the model folder, S3 upload, deploy, stream, delete."""
