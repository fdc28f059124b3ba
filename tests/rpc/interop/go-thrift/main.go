// Interop peer for tests/rpc/test_thrift_interop.py: a Go rpcx server or client whose
// payloads are Thrift structs (rpcx's serialize type 4, codec.ThriftCodec: Apache Thrift's
// binary protocol). The structs are those of tests/rpc/arith_thrift/arith.thrift
//
//	struct MulArgs  { 1: i64 a, 2: i64 b, 3: string note, 4: list<i32> tags }
//	struct MulReply { 1: i64 c, 2: string note, 3: list<i32> tags }
//
// with the Read and Write methods `thrift --gen go` would give them, written out by hand so
// that building the peer needs no Thrift compiler.
//
//	go run . server ADDR              serve Arith.Mul on ADDR until killed; prints "ready ADDR".
//	                                  Mul answers c = a*b, note = "go:" + note, tags reversed
//	go run . client ADDR A B NOTE T.. call Arith.Mul over rpcx with Thrift payloads; print the reply as JSON
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"time"

	"github.com/apache/thrift/lib/go/thrift"
	"github.com/smallnest/rpcx/client"
	"github.com/smallnest/rpcx/protocol"
	"github.com/smallnest/rpcx/server"
)

type MulArgs struct {
	A    int64   `json:"a"`
	B    int64   `json:"b"`
	Note string  `json:"note"`
	Tags []int32 `json:"tags"`
}

type MulReply struct {
	C    int64   `json:"c"`
	Note string  `json:"note"`
	Tags []int32 `json:"tags"`
}

// field writers: each returns the first error of the calls it makes
func writeI64(ctx context.Context, o thrift.TProtocol, name string, id int16, v int64) error {
	if err := o.WriteFieldBegin(ctx, name, thrift.I64, id); err != nil {
		return err
	}
	if err := o.WriteI64(ctx, v); err != nil {
		return err
	}
	return o.WriteFieldEnd(ctx)
}

func writeString(ctx context.Context, o thrift.TProtocol, name string, id int16, v string) error {
	if err := o.WriteFieldBegin(ctx, name, thrift.STRING, id); err != nil {
		return err
	}
	if err := o.WriteString(ctx, v); err != nil {
		return err
	}
	return o.WriteFieldEnd(ctx)
}

func writeI32List(ctx context.Context, o thrift.TProtocol, name string, id int16, v []int32) error {
	if err := o.WriteFieldBegin(ctx, name, thrift.LIST, id); err != nil {
		return err
	}
	if err := o.WriteListBegin(ctx, thrift.I32, len(v)); err != nil {
		return err
	}
	for _, x := range v {
		if err := o.WriteI32(ctx, x); err != nil {
			return err
		}
	}
	if err := o.WriteListEnd(ctx); err != nil {
		return err
	}
	return o.WriteFieldEnd(ctx)
}

func readI32List(ctx context.Context, i thrift.TProtocol) ([]int32, error) {
	_, size, err := i.ReadListBegin(ctx)
	if err != nil {
		return nil, err
	}
	out := make([]int32, 0, size)
	for n := 0; n < size; n++ {
		x, err := i.ReadI32(ctx)
		if err != nil {
			return nil, err
		}
		out = append(out, x)
	}
	return out, i.ReadListEnd(ctx)
}

// readStruct reads fields until STOP, handing each to field (which returns false for a field it
// does not know: skipped, as generated code does)
func readStruct(ctx context.Context, i thrift.TProtocol, field func(id int16, t thrift.TType) (bool, error)) error {
	if _, err := i.ReadStructBegin(ctx); err != nil {
		return err
	}
	for {
		_, t, id, err := i.ReadFieldBegin(ctx)
		if err != nil {
			return err
		}
		if t == thrift.STOP {
			break
		}
		known, err := field(id, t)
		if err == nil && !known {
			err = i.Skip(ctx, t)
		}
		if err != nil {
			return err
		}
		if err := i.ReadFieldEnd(ctx); err != nil {
			return err
		}
	}
	return i.ReadStructEnd(ctx)
}

func (p *MulArgs) Write(ctx context.Context, o thrift.TProtocol) error {
	if err := o.WriteStructBegin(ctx, "MulArgs"); err != nil {
		return err
	}
	for _, err := range []error{
		writeI64(ctx, o, "a", 1, p.A), writeI64(ctx, o, "b", 2, p.B),
		writeString(ctx, o, "note", 3, p.Note), writeI32List(ctx, o, "tags", 4, p.Tags),
	} {
		if err != nil {
			return err
		}
	}
	if err := o.WriteFieldStop(ctx); err != nil {
		return err
	}
	return o.WriteStructEnd(ctx)
}

func (p *MulArgs) Read(ctx context.Context, i thrift.TProtocol) error {
	return readStruct(ctx, i, func(id int16, t thrift.TType) (bool, error) {
		var err error
		switch {
		case id == 1 && t == thrift.I64:
			p.A, err = i.ReadI64(ctx)
		case id == 2 && t == thrift.I64:
			p.B, err = i.ReadI64(ctx)
		case id == 3 && t == thrift.STRING:
			p.Note, err = i.ReadString(ctx)
		case id == 4 && t == thrift.LIST:
			p.Tags, err = readI32List(ctx, i)
		default:
			return false, nil
		}
		return true, err
	})
}

func (p *MulReply) Write(ctx context.Context, o thrift.TProtocol) error {
	if err := o.WriteStructBegin(ctx, "MulReply"); err != nil {
		return err
	}
	for _, err := range []error{
		writeI64(ctx, o, "c", 1, p.C), writeString(ctx, o, "note", 2, p.Note),
		writeI32List(ctx, o, "tags", 3, p.Tags),
	} {
		if err != nil {
			return err
		}
	}
	if err := o.WriteFieldStop(ctx); err != nil {
		return err
	}
	return o.WriteStructEnd(ctx)
}

func (p *MulReply) Read(ctx context.Context, i thrift.TProtocol) error {
	return readStruct(ctx, i, func(id int16, t thrift.TType) (bool, error) {
		var err error
		switch {
		case id == 1 && t == thrift.I64:
			p.C, err = i.ReadI64(ctx)
		case id == 2 && t == thrift.STRING:
			p.Note, err = i.ReadString(ctx)
		case id == 3 && t == thrift.LIST:
			p.Tags, err = readI32List(ctx, i)
		default:
			return false, nil
		}
		return true, err
	})
}

type Arith int

func (t *Arith) Mul(ctx context.Context, args *MulArgs, reply *MulReply) error {
	reply.C = args.A * args.B
	reply.Note = "go:" + args.Note
	reply.Tags = make([]int32, 0, len(args.Tags))
	for n := len(args.Tags) - 1; n >= 0; n-- {
		reply.Tags = append(reply.Tags, args.Tags[n])
	}
	return nil
}

func main() {
	if len(os.Args) < 3 {
		fmt.Fprintln(os.Stderr, "usage: server ADDR | client ADDR A B NOTE [TAG...]")
		os.Exit(2)
	}
	switch os.Args[1] {
	case "server":
		s := server.NewServer()
		if err := s.RegisterName("Arith", new(Arith), ""); err != nil {
			panic(err)
		}
		go func() {
			for s.Address() == nil {
				time.Sleep(10 * time.Millisecond)
			}
			fmt.Println("ready", s.Address().String())
		}()
		if err := s.Serve("tcp", os.Args[2]); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
	case "client":
		a, _ := strconv.ParseInt(os.Args[3], 10, 64)
		b, _ := strconv.ParseInt(os.Args[4], 10, 64)
		args := &MulArgs{A: a, B: b, Note: os.Args[5], Tags: []int32{}}
		for _, s := range os.Args[6:] {
			n, _ := strconv.Atoi(s)
			args.Tags = append(args.Tags, int32(n))
		}
		opt := client.DefaultOption
		opt.SerializeType = protocol.Thrift
		d, err := client.NewPeer2PeerDiscovery("tcp@"+os.Args[2], "")
		if err != nil {
			panic(err)
		}
		xc := client.NewXClient("Arith", client.Failfast, client.RandomSelect, d, opt)
		defer xc.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		reply := &MulReply{}
		if err := xc.Call(ctx, "Mul", args, reply); err != nil {
			fmt.Fprintln(os.Stderr, "call failed:", err)
			os.Exit(1)
		}
		out, _ := json.Marshal(reply)
		fmt.Println(string(out))
	default:
		fmt.Fprintln(os.Stderr, "unknown mode", os.Args[1])
		os.Exit(2)
	}
}
