"""Thrift structs of the Thrift interop tests: ``ttypes.py`` is
``thrift --gen py arith.thrift`` (Thrift 0.17), as a user of the Thrift
codec would generate them, unedited but for the line telling linters to skip it."""
