// Interop peer for tests/rpc/test_kcp_interop.py: a Go rpcx server or client over rpcx's
// "kcp" network (built with -tags kcp).
//
//	go run -tags kcp . server ADDR         serve Arith.Mul / Arith.Add on kcp@ADDR until killed;
//	                                       prints "ready"
//	go run -tags kcp . client ADDR A B [N] call Arith.Mul(A, B) N times (default 1) over one
//	                                       connection, print the last reply as JSON
//
// The block crypt is derived as rpcx's examples do: pbkdf2-sha1(KCP_KEY, KCP_SALT, 4096, 32)
// for AES (KCP_KEY default "rpcx-key", KCP_SALT default "rpcx-salt"); KCP_CRYPT=none uses
// kcp-go's no-op block crypt. KCP_STREAM=1 puts each session in stream mode and
// KCP_ACK_NODELAY=1 acknowledges at once, as the plugins of rpcx's examples do (both default off:
// kcp-go's own defaults, message mode and delayed acknowledgements). PAUSE_MS makes the client
// wait that long between calls (a client idle longer than the server keeps its session);
// TIMEOUT_MS is each call's deadline (default 5000).
package main

import (
	"context"
	"crypto/sha1"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"strconv"
	"time"

	"github.com/smallnest/rpcx/client"
	"github.com/smallnest/rpcx/protocol"
	"github.com/smallnest/rpcx/server"
	kcp "github.com/xtaci/kcp-go"
	"golang.org/x/crypto/pbkdf2"
)

type Args struct {
	A int `json:"A"`
	B int `json:"B"`
}

type Reply struct {
	C int `json:"C"`
}

type Arith struct{}

func (t *Arith) Mul(ctx context.Context, args *Args, reply *Reply) error {
	reply.C = args.A * args.B
	return nil
}

func (t *Arith) Add(ctx context.Context, args *Args, reply *Reply) error {
	reply.C = args.A + args.B
	return nil
}

func env(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

func blockCrypt() kcp.BlockCrypt {
	if os.Getenv("KCP_CRYPT") == "none" {
		bc, _ := kcp.NewNoneBlockCrypt(nil)
		return bc
	}
	key := pbkdf2.Key([]byte(env("KCP_KEY", "rpcx-key")), []byte(env("KCP_SALT", "rpcx-salt")), 4096, 32, sha1.New)
	bc, err := kcp.NewAESBlockCrypt(key)
	if err != nil {
		panic(err)
	}
	return bc
}

func tune(conn net.Conn) {
	session, ok := conn.(*kcp.UDPSession)
	if !ok {
		return
	}
	session.SetStreamMode(os.Getenv("KCP_STREAM") == "1")
	session.SetACKNoDelay(os.Getenv("KCP_ACK_NODELAY") == "1")
}

type serverPlugin struct{}

func (serverPlugin) HandleConnAccept(conn net.Conn) (net.Conn, bool) {
	tune(conn)
	return conn, true
}

type clientPlugin struct{}

func (clientPlugin) ConnCreated(conn net.Conn) (net.Conn, error) {
	tune(conn)
	return conn, nil
}

func main() {
	if len(os.Args) < 3 {
		fmt.Fprintln(os.Stderr, "usage: server ADDR | client ADDR A B [N]")
		os.Exit(2)
	}
	addr := os.Args[2]
	switch os.Args[1] {
	case "server":
		s := server.NewServer(server.WithBlockCrypt(blockCrypt()))
		s.Plugins.Add(serverPlugin{})
		if err := s.RegisterName("Arith", new(Arith), ""); err != nil {
			panic(err)
		}
		go func() {
			for s.Address() == nil {
				time.Sleep(10 * time.Millisecond)
			}
			fmt.Println("ready", s.Address().String())
		}()
		if err := s.Serve("kcp", addr); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
	case "client":
		a, _ := strconv.Atoi(os.Args[3])
		b, _ := strconv.Atoi(os.Args[4])
		n := 1
		if len(os.Args) > 5 {
			n, _ = strconv.Atoi(os.Args[5])
		}
		opt := client.DefaultOption
		opt.SerializeType = protocol.JSON
		opt.Block = blockCrypt()
		d, err := client.NewPeer2PeerDiscovery("kcp@"+addr, "")
		if err != nil {
			panic(err)
		}
		pc := client.NewPluginContainer()
		pc.Add(clientPlugin{})
		xc := client.NewXClient("Arith", client.Failfast, client.RandomSelect, d, opt)
		xc.SetPlugins(pc)
		defer xc.Close()
		pause, _ := strconv.Atoi(os.Getenv("PAUSE_MS"))
		timeout, _ := strconv.Atoi(env("TIMEOUT_MS", "5000"))
		reply := &Reply{}
		for i := 0; i < n; i++ {
			if i > 0 && pause > 0 {
				time.Sleep(time.Duration(pause) * time.Millisecond)
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Duration(timeout)*time.Millisecond)
			err := xc.Call(ctx, "Mul", &Args{A: a, B: b + i - (n - 1)}, reply)
			cancel()
			if err != nil {
				fmt.Fprintln(os.Stderr, "call failed:", err)
				os.Exit(1)
			}
		}
		out, _ := json.Marshal(reply)
		fmt.Println(string(out))
	default:
		os.Exit(2)
	}
}
