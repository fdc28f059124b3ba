// The payloads of tests/rpc/test_thrift_interop.py; ttypes.py is `thrift --gen py` of this file,
// tests/rpc/interop/go-thrift/main.go has the Go structs `thrift --gen go` would make
// (Arith.Mul over rpcx, serialize type 4).
namespace py arith_thrift
namespace go arith

struct MulArgs {
  1: i64 a,
  2: i64 b,
  3: string note,
  4: list<i32> tags,
}

struct MulReply {
  1: i64 c,
  2: string note,
  3: list<i32> tags,
}
