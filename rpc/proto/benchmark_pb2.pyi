from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable
from typing import ClassVar as _ClassVar, Optional as _Optional

DESCRIPTOR: _descriptor.FileDescriptor

class BenchmarkMessage(_message.Message):
    __slots__ = ("field1", "field9", "field18", "field80", "field81", "field2", "field3", "field280", "field6", "field22", "field4", "field5", "field59", "field7", "field16", "field130", "field12", "field17", "field13", "field14", "field104", "field100", "field101", "field102", "field103", "field29", "field30", "field60", "field271", "field272", "field150", "field23", "field24", "field25", "field78", "field67", "field68", "field128", "field129", "field131")
    FIELD1_FIELD_NUMBER: _ClassVar[int]
    FIELD9_FIELD_NUMBER: _ClassVar[int]
    FIELD18_FIELD_NUMBER: _ClassVar[int]
    FIELD80_FIELD_NUMBER: _ClassVar[int]
    FIELD81_FIELD_NUMBER: _ClassVar[int]
    FIELD2_FIELD_NUMBER: _ClassVar[int]
    FIELD3_FIELD_NUMBER: _ClassVar[int]
    FIELD280_FIELD_NUMBER: _ClassVar[int]
    FIELD6_FIELD_NUMBER: _ClassVar[int]
    FIELD22_FIELD_NUMBER: _ClassVar[int]
    FIELD4_FIELD_NUMBER: _ClassVar[int]
    FIELD5_FIELD_NUMBER: _ClassVar[int]
    FIELD59_FIELD_NUMBER: _ClassVar[int]
    FIELD7_FIELD_NUMBER: _ClassVar[int]
    FIELD16_FIELD_NUMBER: _ClassVar[int]
    FIELD130_FIELD_NUMBER: _ClassVar[int]
    FIELD12_FIELD_NUMBER: _ClassVar[int]
    FIELD17_FIELD_NUMBER: _ClassVar[int]
    FIELD13_FIELD_NUMBER: _ClassVar[int]
    FIELD14_FIELD_NUMBER: _ClassVar[int]
    FIELD104_FIELD_NUMBER: _ClassVar[int]
    FIELD100_FIELD_NUMBER: _ClassVar[int]
    FIELD101_FIELD_NUMBER: _ClassVar[int]
    FIELD102_FIELD_NUMBER: _ClassVar[int]
    FIELD103_FIELD_NUMBER: _ClassVar[int]
    FIELD29_FIELD_NUMBER: _ClassVar[int]
    FIELD30_FIELD_NUMBER: _ClassVar[int]
    FIELD60_FIELD_NUMBER: _ClassVar[int]
    FIELD271_FIELD_NUMBER: _ClassVar[int]
    FIELD272_FIELD_NUMBER: _ClassVar[int]
    FIELD150_FIELD_NUMBER: _ClassVar[int]
    FIELD23_FIELD_NUMBER: _ClassVar[int]
    FIELD24_FIELD_NUMBER: _ClassVar[int]
    FIELD25_FIELD_NUMBER: _ClassVar[int]
    FIELD78_FIELD_NUMBER: _ClassVar[int]
    FIELD67_FIELD_NUMBER: _ClassVar[int]
    FIELD68_FIELD_NUMBER: _ClassVar[int]
    FIELD128_FIELD_NUMBER: _ClassVar[int]
    FIELD129_FIELD_NUMBER: _ClassVar[int]
    FIELD131_FIELD_NUMBER: _ClassVar[int]
    field1: str
    field9: str
    field18: str
    field80: bool
    field81: bool
    field2: int
    field3: int
    field280: int
    field6: int
    field22: int
    field4: str
    field5: _containers.RepeatedScalarFieldContainer[int]
    field59: bool
    field7: str
    field16: int
    field130: int
    field12: bool
    field17: bool
    field13: bool
    field14: bool
    field104: int
    field100: int
    field101: int
    field102: str
    field103: str
    field29: int
    field30: bool
    field60: int
    field271: int
    field272: int
    field150: int
    field23: int
    field24: bool
    field25: int
    field78: bool
    field67: int
    field68: int
    field128: int
    field129: str
    field131: int
    def __init__(self, field1: _Optional[str] = ..., field9: _Optional[str] = ..., field18: _Optional[str] = ..., field80: _Optional[bool] = ..., field81: _Optional[bool] = ..., field2: _Optional[int] = ..., field3: _Optional[int] = ..., field280: _Optional[int] = ..., field6: _Optional[int] = ..., field22: _Optional[int] = ..., field4: _Optional[str] = ..., field5: _Optional[_Iterable[int]] = ..., field59: _Optional[bool] = ..., field7: _Optional[str] = ..., field16: _Optional[int] = ..., field130: _Optional[int] = ..., field12: _Optional[bool] = ..., field17: _Optional[bool] = ..., field13: _Optional[bool] = ..., field14: _Optional[bool] = ..., field104: _Optional[int] = ..., field100: _Optional[int] = ..., field101: _Optional[int] = ..., field102: _Optional[str] = ..., field103: _Optional[str] = ..., field29: _Optional[int] = ..., field30: _Optional[bool] = ..., field60: _Optional[int] = ..., field271: _Optional[int] = ..., field272: _Optional[int] = ..., field150: _Optional[int] = ..., field23: _Optional[int] = ..., field24: _Optional[bool] = ..., field25: _Optional[int] = ..., field78: _Optional[bool] = ..., field67: _Optional[int] = ..., field68: _Optional[int] = ..., field128: _Optional[int] = ..., field129: _Optional[str] = ..., field131: _Optional[int] = ...) -> None: ...
