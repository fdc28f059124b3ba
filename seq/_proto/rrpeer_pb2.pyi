from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Status(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    OK: _ClassVar[Status]
    NOT_READY: _ClassVar[Status]
    WRONG_CLUSTER: _ClassVar[Status]
    EXHAUSTED: _ClassVar[Status]
    WRONG_EPOCH: _ClassVar[Status]
    REMOVED: _ClassVar[Status]
    BUSY: _ClassVar[Status]
    STALE: _ClassVar[Status]

class State(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    BOOTSTRAPPING: _ClassVar[State]
    CATCHING_UP: _ClassVar[State]
    READY: _ClassVar[State]
    JOINING: _ClassVar[State]
    REMOVED_MEMBER: _ClassVar[State]
OK: Status
NOT_READY: Status
WRONG_CLUSTER: Status
EXHAUSTED: Status
WRONG_EPOCH: Status
REMOVED: Status
BUSY: Status
STALE: Status
BOOTSTRAPPING: State
CATCHING_UP: State
READY: State
JOINING: State
REMOVED_MEMBER: State

class ReadRequest(_message.Message):
    __slots__ = ("cluster", "name")
    CLUSTER_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    cluster: str
    name: str
    def __init__(self, cluster: _Optional[str] = ..., name: _Optional[str] = ...) -> None: ...

class ReadReply(_message.Message):
    __slots__ = ("status", "value")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    status: Status
    value: int
    def __init__(self, status: _Optional[_Union[Status, str]] = ..., value: _Optional[int] = ...) -> None: ...

class CasRequest(_message.Message):
    __slots__ = ("cluster", "name", "expected", "new_value")
    CLUSTER_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_FIELD_NUMBER: _ClassVar[int]
    NEW_VALUE_FIELD_NUMBER: _ClassVar[int]
    cluster: str
    name: str
    expected: int
    new_value: int
    def __init__(self, cluster: _Optional[str] = ..., name: _Optional[str] = ..., expected: _Optional[int] = ..., new_value: _Optional[int] = ...) -> None: ...

class CasReply(_message.Message):
    __slots__ = ("status", "ok", "current")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    OK_FIELD_NUMBER: _ClassVar[int]
    CURRENT_FIELD_NUMBER: _ClassVar[int]
    status: Status
    ok: bool
    current: int
    def __init__(self, status: _Optional[_Union[Status, str]] = ..., ok: _Optional[bool] = ..., current: _Optional[int] = ...) -> None: ...

class AcquireRequest(_message.Message):
    __slots__ = ("cluster", "name", "count")
    CLUSTER_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    cluster: str
    name: str
    count: int
    def __init__(self, cluster: _Optional[str] = ..., name: _Optional[str] = ..., count: _Optional[int] = ...) -> None: ...

class AcquireReply(_message.Message):
    __slots__ = ("status", "from_id", "to_id")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    FROM_ID_FIELD_NUMBER: _ClassVar[int]
    TO_ID_FIELD_NUMBER: _ClassVar[int]
    status: Status
    from_id: int
    to_id: int
    def __init__(self, status: _Optional[_Union[Status, str]] = ..., from_id: _Optional[int] = ..., to_id: _Optional[int] = ...) -> None: ...

class SnapshotRequest(_message.Message):
    __slots__ = ("cluster", "endpoint_only")
    CLUSTER_FIELD_NUMBER: _ClassVar[int]
    ENDPOINT_ONLY_FIELD_NUMBER: _ClassVar[int]
    cluster: str
    endpoint_only: bool
    def __init__(self, cluster: _Optional[str] = ..., endpoint_only: _Optional[bool] = ...) -> None: ...

class SnapshotReply(_message.Message):
    __slots__ = ("status", "state", "values", "peer_port")
    class ValuesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    STATUS_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    VALUES_FIELD_NUMBER: _ClassVar[int]
    PEER_PORT_FIELD_NUMBER: _ClassVar[int]
    status: Status
    state: State
    values: _containers.ScalarMap[str, int]
    peer_port: int
    def __init__(self, status: _Optional[_Union[Status, str]] = ..., state: _Optional[_Union[State, str]] = ..., values: _Optional[_Mapping[str, int]] = ..., peer_port: _Optional[int] = ...) -> None: ...
