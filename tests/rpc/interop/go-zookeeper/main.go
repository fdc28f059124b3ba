// ZooKeeper interop peer for tests/rpc/test_zookeeper_interop.py: a Go rpcx server registered
// in ZooKeeper, or Go clients discovering servers there, both through rpcx-zookeeper
// (github.com/rpcxio/rpcx-zookeeper, the commit served by the Go module proxy as
// v0.0.0-20220730061732-d20531677676; the repository has no tags) over
// github.com/rpcxio/libkv v0.5.1's zookeeper store, with github.com/smallnest/rpcx v1.9.1.
//
//	server ADDR ZK BASE [GROUP]  serve Arith.Mul / Arith.Add (JSON) on ADDR, registered with
//	                             serverplugin.ZooKeeperRegisterPlugin under BASE (metadata
//	                             "group=GROUP" when given); prints "ready ADDR" once registered;
//	                             on SIGTERM shuts down (which unregisters) and exits 0
//	client ZK BASE A B [GROUP]   call Arith.Mul(A, B) through an XClient on
//	                             client.NewZookeeperDiscovery (with Option.Group = GROUP)
//	                             and print the reply as JSON
//	watch ZK BASE SERVICE        print the servers the discovery found ("initial ADDR=META ...",
//	                             sorted), then each update its watch sends ("servers ADDR=META ...",
//	                             the first one as soon as libkv's WatchTree starts)
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/signal"
	"sort"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	zkclient "github.com/rpcxio/rpcx-zookeeper/client"
	"github.com/rpcxio/rpcx-zookeeper/serverplugin"
	"github.com/smallnest/rpcx/client"
	"github.com/smallnest/rpcx/protocol"
	"github.com/smallnest/rpcx/server"
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

func fail(format string, a ...any) {
	fmt.Fprintf(os.Stderr, format+"\n", a...)
	os.Exit(1)
}

func serve(addr, zk, base, group string) {
	s := server.NewServer()
	plugin := &serverplugin.ZooKeeperRegisterPlugin{
		ServiceAddress:   "tcp@" + addr,
		ZooKeeperServers: []string{zk},
		BasePath:         base,
		// > 0 makes the nodes ephemeral (libkv creates them so when a TTL is given) and
		// starts the plugin's refresh loop, as rpcx's examples do (they use a minute)
		UpdateInterval: time.Second,
	}
	if err := plugin.Start(); err != nil {
		fail("zookeeper plugin: %v", err)
	}
	s.Plugins.Add(plugin)
	meta := ""
	if group != "" {
		meta = "group=" + group
	}
	if err := s.RegisterName("Arith", new(Arith), meta); err != nil {
		fail("register: %v", err)
	}
	var stopping atomic.Bool
	go func() {
		if err := s.Serve("tcp", addr); err != nil && err != server.ErrServerClosed && !stopping.Load() {
			fail("serve: %v", err)
		}
	}()
	for s.Address() == nil {
		time.Sleep(10 * time.Millisecond)
	}
	fmt.Println("ready", s.Address().String())

	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	<-sig
	stopping.Store(true)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = s.Shutdown(ctx) // unregisters every service (the plugin deletes its nodes)
	if err := plugin.Stop(); err != nil {
		fail("zookeeper plugin stop: %v", err)
	}
}

func call(zk, base string, a, b int, group string) {
	d, err := zkclient.NewZookeeperDiscovery(base, "Arith", []string{zk}, nil)
	if err != nil {
		fail("discovery: %v", err)
	}
	opt := client.DefaultOption
	opt.SerializeType = protocol.JSON
	opt.Group = group
	xc := client.NewXClient("Arith", client.Failfast, client.RandomSelect, d, opt)
	defer xc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	reply := &Reply{}
	if err := xc.Call(ctx, "Mul", &Args{A: a, B: b}, reply); err != nil {
		fail("call failed: %v", err)
	}
	out, _ := json.Marshal(reply)
	fmt.Println(string(out))
}

func printServers(what string, pairs []*client.KVPair) {
	items := make([]string, 0, len(pairs))
	for _, p := range pairs {
		items = append(items, p.Key+"="+p.Value)
	}
	sort.Strings(items)
	fmt.Println(strings.TrimSpace(what + " " + strings.Join(items, " ")))
}

func watch(zk, base, service string) {
	d, err := zkclient.NewZookeeperDiscovery(base, service, []string{zk}, nil)
	if err != nil {
		fail("discovery: %v", err)
	}
	ch := d.WatchService()
	printServers("initial", d.GetServices())
	for pairs := range ch {
		printServers("servers", pairs)
	}
}

func main() {
	if len(os.Args) < 4 {
		fmt.Fprintln(os.Stderr, "usage: server ADDR ZK BASE [GROUP] | client ZK BASE A B [GROUP] | watch ZK BASE SERVICE")
		os.Exit(2)
	}
	arg := func(i int) string {
		if i < len(os.Args) {
			return os.Args[i]
		}
		return ""
	}
	switch os.Args[1] {
	case "server":
		serve(os.Args[2], os.Args[3], arg(4), arg(5))
	case "client":
		a, _ := strconv.Atoi(arg(4))
		b, _ := strconv.Atoi(arg(5))
		call(os.Args[2], os.Args[3], a, b, arg(6))
	case "watch":
		watch(os.Args[2], os.Args[3], arg(4))
	default:
		os.Exit(2)
	}
}
