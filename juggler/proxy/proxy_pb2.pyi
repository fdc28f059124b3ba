from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Error(_message.Message):
    __slots__ = ("code", "reason")
    CODE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    code: int
    reason: str
    def __init__(self, code: _Optional[int] = ..., reason: _Optional[str] = ...) -> None: ...

class ConnectRequest(_message.Message):
    __slots__ = ("client", "transport", "protocol", "user", "remote", "path", "headers", "cookies", "token")
    class HeadersEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    class CookiesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    CLIENT_FIELD_NUMBER: _ClassVar[int]
    TRANSPORT_FIELD_NUMBER: _ClassVar[int]
    PROTOCOL_FIELD_NUMBER: _ClassVar[int]
    USER_FIELD_NUMBER: _ClassVar[int]
    REMOTE_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    HEADERS_FIELD_NUMBER: _ClassVar[int]
    COOKIES_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    client: str
    transport: str
    protocol: str
    user: str
    remote: str
    path: str
    headers: _containers.ScalarMap[str, str]
    cookies: _containers.ScalarMap[str, str]
    token: str
    def __init__(self, client: _Optional[str] = ..., transport: _Optional[str] = ..., protocol: _Optional[str] = ..., user: _Optional[str] = ..., remote: _Optional[str] = ..., path: _Optional[str] = ..., headers: _Optional[_Mapping[str, str]] = ..., cookies: _Optional[_Mapping[str, str]] = ..., token: _Optional[str] = ...) -> None: ...

class ConnectResult(_message.Message):
    __slots__ = ("user", "expire_at", "data", "channels")
    USER_FIELD_NUMBER: _ClassVar[int]
    EXPIRE_AT_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    CHANNELS_FIELD_NUMBER: _ClassVar[int]
    user: str
    expire_at: int
    data: bytes
    channels: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, user: _Optional[str] = ..., expire_at: _Optional[int] = ..., data: _Optional[bytes] = ..., channels: _Optional[_Iterable[str]] = ...) -> None: ...

class ConnectResponse(_message.Message):
    __slots__ = ("result", "error")
    RESULT_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    result: ConnectResult
    error: Error
    def __init__(self, result: _Optional[_Union[ConnectResult, _Mapping]] = ..., error: _Optional[_Union[Error, _Mapping]] = ...) -> None: ...

class RefreshRequest(_message.Message):
    __slots__ = ("client", "transport", "protocol", "user", "expire_at", "data")
    CLIENT_FIELD_NUMBER: _ClassVar[int]
    TRANSPORT_FIELD_NUMBER: _ClassVar[int]
    PROTOCOL_FIELD_NUMBER: _ClassVar[int]
    USER_FIELD_NUMBER: _ClassVar[int]
    EXPIRE_AT_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    client: str
    transport: str
    protocol: str
    user: str
    expire_at: int
    data: bytes
    def __init__(self, client: _Optional[str] = ..., transport: _Optional[str] = ..., protocol: _Optional[str] = ..., user: _Optional[str] = ..., expire_at: _Optional[int] = ..., data: _Optional[bytes] = ...) -> None: ...

class RefreshResult(_message.Message):
    __slots__ = ("expired", "expire_at", "data")
    EXPIRED_FIELD_NUMBER: _ClassVar[int]
    EXPIRE_AT_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    expired: bool
    expire_at: int
    data: bytes
    def __init__(self, expired: _Optional[bool] = ..., expire_at: _Optional[int] = ..., data: _Optional[bytes] = ...) -> None: ...

class RefreshResponse(_message.Message):
    __slots__ = ("result", "error")
    RESULT_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    result: RefreshResult
    error: Error
    def __init__(self, result: _Optional[_Union[RefreshResult, _Mapping]] = ..., error: _Optional[_Union[Error, _Mapping]] = ...) -> None: ...

class SubscribeRequest(_message.Message):
    __slots__ = ("client", "transport", "protocol", "user", "channel", "pattern")
    CLIENT_FIELD_NUMBER: _ClassVar[int]
    TRANSPORT_FIELD_NUMBER: _ClassVar[int]
    PROTOCOL_FIELD_NUMBER: _ClassVar[int]
    USER_FIELD_NUMBER: _ClassVar[int]
    CHANNEL_FIELD_NUMBER: _ClassVar[int]
    PATTERN_FIELD_NUMBER: _ClassVar[int]
    client: str
    transport: str
    protocol: str
    user: str
    channel: str
    pattern: bool
    def __init__(self, client: _Optional[str] = ..., transport: _Optional[str] = ..., protocol: _Optional[str] = ..., user: _Optional[str] = ..., channel: _Optional[str] = ..., pattern: _Optional[bool] = ...) -> None: ...

class SubscribeResult(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class SubscribeResponse(_message.Message):
    __slots__ = ("result", "error")
    RESULT_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    result: SubscribeResult
    error: Error
    def __init__(self, result: _Optional[_Union[SubscribeResult, _Mapping]] = ..., error: _Optional[_Union[Error, _Mapping]] = ...) -> None: ...

class PublishRequest(_message.Message):
    __slots__ = ("client", "transport", "protocol", "user", "channel", "data")
    CLIENT_FIELD_NUMBER: _ClassVar[int]
    TRANSPORT_FIELD_NUMBER: _ClassVar[int]
    PROTOCOL_FIELD_NUMBER: _ClassVar[int]
    USER_FIELD_NUMBER: _ClassVar[int]
    CHANNEL_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    client: str
    transport: str
    protocol: str
    user: str
    channel: str
    data: bytes
    def __init__(self, client: _Optional[str] = ..., transport: _Optional[str] = ..., protocol: _Optional[str] = ..., user: _Optional[str] = ..., channel: _Optional[str] = ..., data: _Optional[bytes] = ...) -> None: ...

class PublishResult(_message.Message):
    __slots__ = ("data",)
    DATA_FIELD_NUMBER: _ClassVar[int]
    data: bytes
    def __init__(self, data: _Optional[bytes] = ...) -> None: ...

class PublishResponse(_message.Message):
    __slots__ = ("result", "error")
    RESULT_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    result: PublishResult
    error: Error
    def __init__(self, result: _Optional[_Union[PublishResult, _Mapping]] = ..., error: _Optional[_Union[Error, _Mapping]] = ...) -> None: ...

class RPCRequest(_message.Message):
    __slots__ = ("client", "transport", "protocol", "user", "uri", "data")
    CLIENT_FIELD_NUMBER: _ClassVar[int]
    TRANSPORT_FIELD_NUMBER: _ClassVar[int]
    PROTOCOL_FIELD_NUMBER: _ClassVar[int]
    USER_FIELD_NUMBER: _ClassVar[int]
    URI_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    client: str
    transport: str
    protocol: str
    user: str
    uri: str
    data: bytes
    def __init__(self, client: _Optional[str] = ..., transport: _Optional[str] = ..., protocol: _Optional[str] = ..., user: _Optional[str] = ..., uri: _Optional[str] = ..., data: _Optional[bytes] = ...) -> None: ...

class RPCResult(_message.Message):
    __slots__ = ("data",)
    DATA_FIELD_NUMBER: _ClassVar[int]
    data: bytes
    def __init__(self, data: _Optional[bytes] = ...) -> None: ...

class RPCResponse(_message.Message):
    __slots__ = ("result", "error")
    RESULT_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    result: RPCResult
    error: Error
    def __init__(self, result: _Optional[_Union[RPCResult, _Mapping]] = ..., error: _Optional[_Union[Error, _Mapping]] = ...) -> None: ...
