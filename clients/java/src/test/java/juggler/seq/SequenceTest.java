package juggler.seq;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertInstanceOf;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;
import static org.junit.jupiter.api.Assertions.fail;
import static org.junit.jupiter.api.Assumptions.assumeTrue;

import java.io.IOException;
import java.net.InetAddress;
import java.net.ServerSocket;
import java.net.Socket;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.HashSet;
import java.util.List;
import java.util.Set;
import java.util.concurrent.ConcurrentLinkedQueue;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicReference;
import org.junit.jupiter.api.Test;

/**
 * The cluster tests need a running three-member cluster: SEQ_SERVERS lists its members and
 * SEQ_KILL_PID names the process of one, which memberKilledWhileDrawing kills. The test command
 * starts one (tests/seq/test_clients.py); by hand: {@code juggler seq up}, then {@code
 * SEQ_SERVERS=127.0.0.1:19001,127.0.0.1:19002,127.0.0.1:19003 mvn test}.
 */
class SequenceTest {
  static List<String> cluster() {
    String v = System.getenv("SEQ_SERVERS");
    assumeTrue(v != null && !v.isEmpty(), "SEQ_SERVERS is not set (the members of a running seq cluster)");
    return Arrays.asList(v.split(","));
  }

  /** n IDs from k threads; each thread's IDs must increase. */
  static List<Long> draw(Sequence s, int k, int n, Runnable atHundred) throws InterruptedException {
    ConcurrentLinkedQueue<Long> all = new ConcurrentLinkedQueue<>();
    AtomicReference<Throwable> error = new AtomicReference<>();
    List<Thread> threads = new ArrayList<>();
    for (int g = 0; g < k; g++) {
      final int me = g;
      Thread t = new Thread(() -> {
        long last = 0;
        try {
          for (int i = 0; i < n; i++) {
            if (me == 0 && i == 100 && atHundred != null) {
              atHundred.run();
            }
            long id = s.next(Duration.ofSeconds(20));
            if (id <= last) {
              throw new AssertionError("IDs out of order: " + id + " after " + last);
            }
            last = id;
            all.add(id);
          }
        } catch (Throwable e) {
          error.compareAndSet(null, e);
        }
      });
      threads.add(t);
      t.start();
    }
    for (Thread t : threads) {
      t.join(60_000);
      if (t.isAlive()) {
        fail("a drawing thread did not finish in 60 s");
      }
    }
    if (error.get() != null) {
      throw new AssertionError(error.get());
    }
    return new ArrayList<>(all);
  }

  static void assertUnique(List<Long> ids) {
    Set<Long> seen = new HashSet<>();
    for (long id : ids) {
      assertTrue(seen.add(id), "ID " + id + " handed out twice");
    }
  }

  static String closedPort() throws IOException {
    try (ServerSocket s = new ServerSocket(0, 1, InetAddress.getLoopbackAddress())) {
      return "127.0.0.1:" + s.getLocalPort();
    }
  }

  @Test
  void drawsAreUniqueAndIncreasing() throws Exception {
    try (SeqClient c = SeqClient.builder(cluster()).build();
        SeqClient other = SeqClient.builder(cluster()).build()) {
      List<Long> ids = draw(c.sequence("java-draws", Sequence.options().bufSize(50)), 8, 500, null);
      List<Long> more = draw(other.sequence("java-draws", Sequence.options().bufSize(0)), 2, 20, null);
      ids.addAll(more);
      assertUnique(ids);
      long cur = c.curId("java-draws", Duration.ofSeconds(5));
      for (long id : more) {
        assertTrue(id <= cur, "CurID " + cur + " is below the handed-out ID " + id);
      }
    }
  }

  @Test
  void unbufferedDrawsAreConsecutive() {
    try (SeqClient c = SeqClient.builder(cluster()).build()) {
      Sequence s = c.sequence("java-unbuffered", Sequence.options().bufSize(0));
      long a = s.next();
      assertEquals(a + 1, s.next());
    }
  }

  @Test
  void failsOverPastADeadMember() throws Exception {
    List<String> servers = new ArrayList<>(List.of(closedPort()));
    servers.addAll(cluster());
    try (SeqClient c = SeqClient.builder(servers).build()) {
      assertUnique(draw(c.sequence("java-failover", Sequence.options().bufSize(0)), 4, 50, null));
    }
  }

  @Test
  void memberKilledWhileDrawing() throws Exception {
    List<String> servers = cluster();
    String pid = System.getenv("SEQ_KILL_PID");
    assumeTrue(pid != null && !pid.isEmpty(), "SEQ_KILL_PID is not set (a member this test may kill)");
    ProcessHandle member = ProcessHandle.of(Long.parseLong(pid)).orElseThrow();
    try (SeqClient c = SeqClient.builder(servers).build()) {
      Sequence s = c.sequence("java-kill", Sequence.options().bufSize(20).timeout(Duration.ofSeconds(15)));
      List<Long> ids = draw(s, 6, 400, member::destroyForcibly);
      ids.addAll(draw(c.sequence("java-kill", Sequence.options().bufSize(0)), 2, 50, null));
      assertUnique(ids);
    }
  }

  @Test
  void unavailableWithinTheTimeout() throws Exception {
    try (SeqClient c = SeqClient.builder(List.of(closedPort(), closedPort()))
        .backoff(Duration.ofMillis(20), Duration.ofMillis(100)).build()) {
      Sequence s = c.sequence("nowhere", Sequence.options().timeout(Duration.ofMillis(700)));
      long t0 = System.nanoTime();
      SeqException.Unavailable e = assertThrows(SeqException.Unavailable.class, () -> s.next(Duration.ofSeconds(10)));
      assertTrue(e.getMessage().contains("nowhere"), e.getMessage());
      assertTrue(System.nanoTime() - t0 < TimeUnit.SECONDS.toNanos(5), "the fetch's timeout is 700 ms");
    }
  }

  /** A member that accepts and never answers. */
  static final class Silent implements AutoCloseable {
    final ServerSocket server;
    final List<Socket> conns = new ArrayList<>();

    Silent() throws IOException {
      server = new ServerSocket(0, 50, InetAddress.getLoopbackAddress());
      Thread t = new Thread(() -> {
        try {
          while (true) {
            Socket s = server.accept();
            synchronized (conns) {
              conns.add(s);
            }
          }
        } catch (IOException e) {
          // closed
        }
      });
      t.setDaemon(true);
      t.start();
    }

    String addr() {
      return "127.0.0.1:" + server.getLocalPort();
    }

    @Override
    public void close() throws IOException {
      server.close();
      synchronized (conns) {
        for (Socket s : conns) {
          s.close();
        }
      }
    }
  }

  @Test
  void theCallersDeadlineBoundsADraw() throws Exception {
    try (Silent silent = new Silent(); SeqClient c = SeqClient.builder(List.of(silent.addr())).build()) {
      Sequence s = c.sequence("hung", Sequence.options().timeout(Duration.ofSeconds(30)));
      long t0 = System.nanoTime();
      assertThrows(SeqException.DeadlineExceeded.class, () -> s.next(Duration.ofMillis(300)));
      assertTrue(System.nanoTime() - t0 < TimeUnit.SECONDS.toNanos(5), "the caller gave 300 ms");
    }
  }

  @Test
  void closeReleasesWaitingCallers() throws Exception {
    try (Silent silent = new Silent()) {
      SeqClient c = SeqClient.builder(List.of(silent.addr())).build();
      Sequence s = c.sequence("hung", Sequence.options().timeout(Duration.ofSeconds(30)));
      AtomicReference<Throwable> got = new AtomicReference<>();
      CountDownLatch done = new CountDownLatch(1);
      Thread t = new Thread(() -> {
        try {
          s.next(Duration.ofSeconds(20));
        } catch (Throwable e) {
          got.set(e);
        }
        done.countDown();
      });
      t.start();
      // the caller waits on the fetch before the client is closed
      long until = System.nanoTime() + TimeUnit.SECONDS.toNanos(5);
      while (!t.getState().equals(Thread.State.TIMED_WAITING)) {
        assertTrue(System.nanoTime() < until, "the caller never started waiting");
        Thread.sleep(5);
      }
      c.close();
      assertTrue(done.await(5, TimeUnit.SECONDS), "close did not release the waiting caller");
      assertInstanceOf(SeqException.Closed.class, got.get());
      assertThrows(SeqException.Closed.class, s::next);
    }
  }
}
