"""Example models written as plain numpy functions (no graphc imports): an MLP classifier, a
GPT-style decoder, and a CNN with im2col convolutions. Each file has ``example_args()`` returning
``(args, kwargs)`` so that tools (``graphc ir FILE:FUNC``) can run it."""
