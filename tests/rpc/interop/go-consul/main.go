// Interop peer for tests/rpc/test_consul_registry_interop.py: a Go rpcx server
// registered in Consul with rpcx-consul's ConsulRegisterPlugin, or a Go rpcx
// XClient that finds its servers with rpcx-consul's ConsulDiscovery (both
// through github.com/rpcxio/libkv's Consul store).
//
//	go run . server ADDR CONSUL BASE [GROUP]   serve Arith.Mul (JSON) on ADDR, registered under
//	                                           BASE (metadata group=GROUP when given), refreshed
//	                                           every 10 s (TTL 20 s: Consul's sessions last at
//	                                           least 10 s, and libkv asks half the TTL); prints
//	                                           "ready" once registered and serving, and
//	                                           deregisters on SIGTERM/SIGINT
//	go run . client CONSUL BASE A B [GROUP]    call Arith.Mul(A, B) through an XClient
//	                                           (failtry, random selector, Option.Group=GROUP);
//	                                           prints the reply as JSON
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"sync/atomic"
	"syscall"
	"time"

	consulclient "github.com/rpcxio/rpcx-consul/client"
	"github.com/rpcxio/rpcx-consul/serverplugin"
	"github.com/smallnest/rpcx/client"
	"github.com/smallnest/rpcx/server"
	"github.com/smallnest/rpcx/share"
)

type Args struct {
	A int `json:"A"`
	B int `json:"B"`
}

type Reply struct {
	C      int    `json:"C"`
	Server string `json:"Server,omitempty"`
}

type Arith struct{ addr string }

func (t *Arith) Mul(ctx context.Context, args *Args, reply *Reply) error {
	reply.C = args.A * args.B
	reply.Server = "go@" + t.addr
	return nil
}

func fail(format string, a ...any) {
	fmt.Fprintf(os.Stderr, format+"\n", a...)
	os.Exit(2)
}

func serve(addr, consul, base, group string) {
	s := server.NewServer()
	plugin := serverplugin.NewConsulRegisterPlugin(
		serverplugin.WithConsulServiceAddress("tcp@"+addr),
		serverplugin.WithConsulServers([]string{consul}),
		serverplugin.WithConsulBasePath(base),
		serverplugin.WithConsulUpdateInterval(10*time.Second),
	)
	if err := plugin.Start(); err != nil {
		fail("consul plugin: %v", err)
	}
	s.Plugins.Add(plugin)
	meta := ""
	if group != "" {
		meta = "group=" + group
	}
	if err := s.RegisterName("Arith", &Arith{addr: addr}, meta); err != nil {
		fail("register: %v", err)
	}
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	var stopping atomic.Bool
	go func() {
		<-stop
		stopping.Store(true)
		_ = plugin.Stop()
		_ = s.Close()
		os.Exit(0)
	}()
	go func() {
		for {
			if s.Address() != nil {
				fmt.Println("ready")
				return
			}
			time.Sleep(10 * time.Millisecond)
		}
	}()
	if err := s.Serve("tcp", addr); err != nil && err != server.ErrServerClosed && !stopping.Load() {
		fail("serve: %v", err)
	}
	select {} // stopping: the signal's goroutine deregisters, then exits the process with 0
}

func call(consul, base string, a, b int, group string) {
	d, err := consulclient.NewConsulDiscovery(base, "Arith", []string{consul}, nil)
	if err != nil {
		fail("discovery: %v", err)
	}
	opt := client.DefaultOption
	opt.SerializeType = 1 // JSON
	opt.Group = group
	xc := client.NewXClient("Arith", client.Failtry, client.RandomSelect, d, opt)
	defer xc.Close()
	reply := &Reply{}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := xc.Call(ctx, "Mul", &Args{A: a, B: b}, reply); err != nil {
		fail("call: %v", err)
	}
	out, _ := json.Marshal(reply)
	fmt.Println(string(out))
}

func main() {
	share.Trace = false
	if len(os.Args) < 2 {
		fail("usage: server ADDR CONSUL BASE [GROUP] | client CONSUL BASE A B [GROUP]")
	}
	switch os.Args[1] {
	case "server":
		if len(os.Args) < 5 {
			fail("usage: server ADDR CONSUL BASE [GROUP]")
		}
		group := ""
		if len(os.Args) > 5 {
			group = os.Args[5]
		}
		serve(os.Args[2], os.Args[3], os.Args[4], group)
	case "client":
		if len(os.Args) < 6 {
			fail("usage: client CONSUL BASE A B [GROUP]")
		}
		a, _ := strconv.Atoi(os.Args[4])
		b, _ := strconv.Atoi(os.Args[5])
		group := ""
		if len(os.Args) > 6 {
			group = os.Args[6]
		}
		call(os.Args[2], os.Args[3], a, b, group)
	default:
		fail("unknown mode %q", os.Args[1])
	}
}
