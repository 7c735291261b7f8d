"""Generated protobuf code for protos/p2pinfer.proto (do not edit by hand).

Import it as ``from p2pinfer.net.proto import p2pinfer_pb2 as pb``.
Regenerate with ``python -m p2pinfer.net.proto.generate``; the test suite
checks that the checked-in files are what that command produces.
"""
