from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Optional as _Optional

DESCRIPTOR: _descriptor.FileDescriptor

class NextIDRequest(_message.Message):
    __slots__ = ("name", "range_size")
    NAME_FIELD_NUMBER: _ClassVar[int]
    RANGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    name: str
    range_size: int
    def __init__(self, name: _Optional[str] = ..., range_size: _Optional[int] = ...) -> None: ...

class NextIDReply(_message.Message):
    __slots__ = ("from_id", "to_id")
    FROM_ID_FIELD_NUMBER: _ClassVar[int]
    TO_ID_FIELD_NUMBER: _ClassVar[int]
    from_id: int
    to_id: int
    def __init__(self, from_id: _Optional[int] = ..., to_id: _Optional[int] = ...) -> None: ...

class CurIDRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class CurIDReply(_message.Message):
    __slots__ = ("cur_id",)
    CUR_ID_FIELD_NUMBER: _ClassVar[int]
    cur_id: int
    def __init__(self, cur_id: _Optional[int] = ...) -> None: ...

class SetIDRequest(_message.Message):
    __slots__ = ("name", "new_id")
    NAME_FIELD_NUMBER: _ClassVar[int]
    NEW_ID_FIELD_NUMBER: _ClassVar[int]
    name: str
    new_id: int
    def __init__(self, name: _Optional[str] = ..., new_id: _Optional[int] = ...) -> None: ...

class SetIDReply(_message.Message):
    __slots__ = ("success",)
    SUCCESS_FIELD_NUMBER: _ClassVar[int]
    success: bool
    def __init__(self, success: _Optional[bool] = ...) -> None: ...
