package juggler.seq;

import io.grpc.ChannelCredentials;
import io.grpc.Grpc;
import io.grpc.InsecureChannelCredentials;
import io.grpc.ManagedChannel;
import io.grpc.Status;
import io.grpc.StatusRuntimeException;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Set;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.ThreadLocalRandom;
import java.util.concurrent.TimeUnit;
import juggler.seq.pb.CurIDRequest;
import juggler.seq.pb.NextIDReply;
import juggler.seq.pb.NextIDRequest;
import juggler.seq.pb.RRAPIGrpc;

/**
 * A client of a seq cluster: one gRPC channel per member, shared by every {@link Sequence} made
 * from it. Members are tried round robin; a member that fails is skipped for a backoff that doubles
 * per consecutive failure (with jitter), one that answers "no quorum" briefly. Thread-safe.
 *
 * <pre>{@code
 * try (SeqClient client = SeqClient.builder(List.of("10.0.0.1:19001", "10.0.0.2:19001", "10.0.0.3:19001")).build()) {
 *   Sequence orders = client.sequence("orders", Sequence.options().bufSize(1000));
 *   long id = orders.next(Duration.ofSeconds(2));
 * }
 * }</pre>
 */
public final class SeqClient implements AutoCloseable {
  private final List<Member> members = new ArrayList<>();
  private final Duration backoffMin;
  private final Duration backoffMax;
  private final ExecutorService fetchers;
  private final Set<Sequence> sequences = ConcurrentHashMap.newKeySet();
  private int rr; // guarded by this
  private volatile boolean closed;

  private static final class Member {
    final String addr;
    final ManagedChannel channel;
    final RRAPIGrpc.RRAPIBlockingStub stub;
    int failures; // guarded by the client
    long retryAtNanos;
    boolean removed; // answered FAILED_PRECONDITION: no longer a member

    Member(String addr, ChannelCredentials creds) {
      this.addr = addr;
      this.channel = Grpc.newChannelBuilder(addr, creds).build();
      this.stub = RRAPIGrpc.newBlockingStub(channel);
    }
  }

  /** How to build a client: {@code SeqClient.builder(servers).tls(creds).backoff(min, max).build()}. */
  public static final class Builder {
    private final List<String> servers;
    private ChannelCredentials credentials = InsecureChannelCredentials.create();
    private Duration backoffMin = Duration.ofMillis(100);
    private Duration backoffMax = Duration.ofSeconds(5);

    private Builder(List<String> servers) {
      this.servers = List.copyOf(servers);
    }

    /** TLS to the members (e.g. {@code TlsChannelCredentials.newBuilder().trustManager(caFile).build()}). */
    public Builder tls(ChannelCredentials credentials) {
      this.credentials = credentials;
      return this;
    }

    /** How long a failed member is skipped: min, doubling per failure up to max (default 100 ms to 5 s). */
    public Builder backoff(Duration min, Duration max) {
      this.backoffMin = min;
      this.backoffMax = max;
      return this;
    }

    public SeqClient build() {
      if (servers.isEmpty()) {
        throw new IllegalArgumentException("at least one server");
      }
      if (backoffMin.isNegative() || backoffMin.isZero() || backoffMax.compareTo(backoffMin) < 0) {
        throw new IllegalArgumentException("backoff needs 0 < min <= max");
      }
      return new SeqClient(this);
    }
  }

  /** A builder for the members at {@code servers} (HOST:PORT). Channels connect lazily. */
  public static Builder builder(List<String> servers) {
    return new Builder(servers);
  }

  private SeqClient(Builder b) {
    this.backoffMin = b.backoffMin;
    this.backoffMax = b.backoffMax;
    for (String addr : b.servers) {
      members.add(new Member(addr, b.credentials));
    }
    this.fetchers = Executors.newCachedThreadPool(r -> {
      Thread t = new Thread(r, "seq-fetch");
      t.setDaemon(true);
      return t;
    });
  }

  /** The sequence {@code name} with default options (a buffer of 100, fetches bounded by 5 s). */
  public Sequence sequence(String name) {
    return sequence(name, Sequence.options());
  }

  /** The sequence {@code name}; sequences of one name on one client are independent buffers. */
  public Sequence sequence(String name, Sequence.Options options) {
    Sequence s = new Sequence(this, name, options);
    if (closed) {
      s.close();
    } else {
      sequences.add(s);
    }
    return s;
  }

  /** The highest ID handed out of {@code name}, as the first member that answers knows it. */
  public long curId(String name, Duration timeout) {
    String last = "no server tried";
    for (Member m : members) {
      try {
        return m.stub.withDeadlineAfter(timeout.toNanos(), TimeUnit.NANOSECONDS)
            .gRPCCurID(CurIDRequest.newBuilder().setName(name).build())
            .getCurId();
      } catch (StatusRuntimeException e) {
        last = m.addr + ": " + e.getStatus().getCode() + " " + e.getStatus().getDescription();
      }
    }
    throw new SeqException.Unavailable("no current ID of '" + name + "': " + last);
  }

  /** Closes every sequence (waiting callers get {@link SeqException.Closed}) and the channels. */
  @Override
  public void close() {
    closed = true;
    for (Sequence s : sequences) {
      s.close();
    }
    fetchers.shutdownNow();
    for (Member m : members) {
      m.channel.shutdownNow();
    }
    for (Member m : members) {
      try {
        m.channel.awaitTermination(5, TimeUnit.SECONDS);
      } catch (InterruptedException e) {
        Thread.currentThread().interrupt();
        return;
      }
    }
  }

  void forget(Sequence s) {
    sequences.remove(s);
  }

  void submit(Runnable fetch) {
    fetchers.execute(fetch);
  }

  /** A fresh range {from, to} of n IDs of name, trying members round robin until timeout. */
  long[] fetch(String name, long n, Duration timeout, Duration attempt, Sequence owner) throws InterruptedException {
    long deadline = System.nanoTime() + timeout.toNanos();
    String reason = "no server tried";
    while (true) {
      if (owner.isClosed()) {
        throw new SeqException.Closed();
      }
      long now = System.nanoTime();
      if (now - deadline >= 0) {
        throw new SeqException.Unavailable("no range of '" + name + "' within " + timeout + ": " + reason);
      }
      Member m;
      long wake = 0;
      boolean allRemoved = true;
      synchronized (this) {
        m = null;
        int k = members.size();
        for (int i = 0; i < k; i++) {
          Member cand = members.get((rr + i) % k);
          if (cand.removed) {
            continue;
          }
          allRemoved = false;
          if (cand.retryAtNanos - now <= 0) {
            rr = (rr + i + 1) % k;
            m = cand;
            break;
          }
          if (wake == 0 || cand.retryAtNanos - wake < 0) {
            wake = cand.retryAtNanos;
          }
        }
      }
      if (allRemoved) {
        throw new SeqException.Unavailable("no range of '" + name + "': every server given was removed from the "
            + "cluster (" + reason + "); give the current members");
      }
      if (m == null) {
        long until = Math.min(wake - now, deadline - now);
        TimeUnit.NANOSECONDS.sleep(Math.max(0, until));
        continue;
      }
      long budget = Math.min(attempt.toNanos(), deadline - now);
      NextIDReply reply;
      try {
        reply = m.stub.withDeadlineAfter(budget, TimeUnit.NANOSECONDS)
            .gRPCNextID(NextIDRequest.newBuilder().setName(name).setRangeSize(n).build());
      } catch (StatusRuntimeException e) {
        Status st = e.getStatus();
        if (owner.isClosed()) {
          throw new SeqException.Closed();
        }
        if (st.getCode() == Status.Code.OUT_OF_RANGE) {
          throw new SeqException.Exhausted(st.getDescription() == null ? "sequence exhausted" : st.getDescription());
        }
        reason = m.addr + ": " + st.getCode() + " " + st.getDescription();
        if (st.getCode() == Status.Code.FAILED_PRECONDITION) {
          synchronized (this) {
            m.removed = true;
          }
          continue;
        }
        failed(m, false);
        continue;
      }
      long from = reply.getFromId();
      long to = reply.getToId();
      if (from == 0 || Long.compareUnsigned(to, from) <= 0) {
        reason = m.addr + ": no quorum";
        failed(m, true);
        continue;
      }
      synchronized (this) {
        m.failures = 0;
      }
      return new long[] {from, to};
    }
  }

  private synchronized void failed(Member m, boolean soft) {
    m.failures++;
    int n = soft ? 1 : m.failures;
    long d = backoffMin.toNanos();
    for (int i = 1; i < n && d < backoffMax.toNanos(); i++) {
      d *= 2;
    }
    d = Math.min(d, backoffMax.toNanos());
    d -= (long) (ThreadLocalRandom.current().nextDouble() * 0.5 * d); // members failed together retry apart
    m.retryAtNanos = System.nanoTime() + d;
  }
}
