// A light gRPC backend for benches/balancer/bench_grpc.py: grpc-go serving
// any method on raw bytes (no generated code). Each call's request message
// comes back as its reply; /bench.Echo/Count answers the number of calls
// served so far (ASCII), so that the benchmark can check that every call the
// load generator counted as a success reached the backend and got an OK.
//
//	grpcpeer HOST:PORT     prints "ready" once serving
package main

import (
	"fmt"
	"net"
	"os"
	"strconv"
	"sync/atomic"

	"google.golang.org/grpc"
)

// raw passes messages through as bytes.
type raw struct{}

func (raw) Marshal(v any) ([]byte, error) { return *(v.(*[]byte)), nil }
func (raw) Unmarshal(data []byte, v any) error {
	*(v.(*[]byte)) = append([]byte(nil), data...)
	return nil
}
func (raw) Name() string { return "proto" }

func main() {
	lis, err := net.Listen("tcp", os.Args[1])
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	var served atomic.Int64
	handler := func(_ any, stream grpc.ServerStream) error {
		method, _ := grpc.MethodFromServerStream(stream)
		var in []byte
		if err := stream.RecvMsg(&in); err != nil {
			return err
		}
		if method == "/bench.Echo/Count" {
			out := []byte(strconv.FormatInt(served.Load(), 10))
			return stream.SendMsg(&out)
		}
		served.Add(1)
		return stream.SendMsg(&in)
	}
	s := grpc.NewServer(grpc.ForceServerCodec(raw{}), grpc.UnknownServiceHandler(handler))
	fmt.Println("ready")
	if err := s.Serve(lis); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
