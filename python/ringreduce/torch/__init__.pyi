# Type stubs of ringreduce.torch: importing it registers the torch.distributed backend BACKEND.
BACKEND: str
