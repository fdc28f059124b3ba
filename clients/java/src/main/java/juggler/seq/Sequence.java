package juggler.seq;

import java.time.Duration;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.locks.Condition;
import java.util.concurrent.locks.ReentrantLock;

/**
 * The IDs of one named sequence, handed out from a buffer: at least {@code bufSize} IDs are fetched
 * at a time and the next range is fetched in the background once half of the current one is used,
 * so most draws take no network round trip. When consumers drain ranges faster than a fetch takes,
 * the fetch size grows (up to {@code maxFetch}); when ranges arrive with more than a quarter unused,
 * it shrinks back. One fetch is in flight at a time and ranges are used in the order obtained, so the
 * IDs one sequence hands out increase in the order {@link #next} returns them, whichever thread
 * calls it. What it holds unused (at most two ranges of at most {@code maxFetch} IDs) is lost as a
 * gap if the process exits. Thread-safe.
 */
public final class Sequence implements AutoCloseable {
  /** Options of a sequence: {@code Sequence.options().bufSize(1000).timeout(Duration.ofSeconds(2))}. */
  public static final class Options {
    long bufSize = 100;
    long maxFetch = -1;
    Duration timeout = Duration.ofSeconds(5);
    Duration attemptTimeout;

    /** IDs a fetch asks for at least (default 100); 0 fetches only as many as callers are waiting. */
    public Options bufSize(long n) {
      if (n < 0) {
        throw new IllegalArgumentException("bufSize must be >= 0");
      }
      bufSize = n;
      return this;
    }

    /** The cap of the adaptive fetch size (default 64 × bufSize; bufSize turns adaptation off). */
    public Options maxFetch(long n) {
      maxFetch = n;
      return this;
    }

    /** Bounds one fetch, every retry and fail-over included (default 5 s). */
    public Options timeout(Duration d) {
      if (d.isNegative() || d.isZero()) {
        throw new IllegalArgumentException("timeout must be > 0");
      }
      timeout = d;
      return this;
    }

    /** Bounds one member's answer (default a third of the timeout). */
    public Options attemptTimeout(Duration d) {
      attemptTimeout = d;
      return this;
    }
  }

  public static Options options() {
    return new Options();
  }

  private final SeqClient client;
  private final String name;
  private final long bufSize;
  private final long maxFetch;
  private final Duration timeout;
  private final Duration attemptTimeout;

  private final ReentrantLock lock = new ReentrantLock();
  private final Condition changed = lock.newCondition();
  // all guarded by lock
  private long cur;
  private long end; // the current range [cur, end)
  private long start;
  private long refillAt; // handing out this ID starts a background fetch (0: none)
  private long[] queued;
  private long high; // one past the highest ID ever obtained
  private long fetchSize;
  private Fetch fetch;
  private int waiting;
  private volatile boolean closed;

  private static final class Fetch {
    boolean done;
    RuntimeException error;
    boolean background;
  }

  Sequence(SeqClient client, String name, Options o) {
    this.client = client;
    this.name = name;
    this.bufSize = o.bufSize;
    this.maxFetch = o.maxFetch < o.bufSize ? 64 * o.bufSize : o.maxFetch;
    this.timeout = o.timeout;
    this.attemptTimeout = o.attemptTimeout != null ? o.attemptTimeout : o.timeout.dividedBy(3);
    this.fetchSize = o.bufSize;
  }

  public String name() {
    return name;
  }

  /** The next ID, waiting at most the sequence's timeout for a fetch. */
  public long next() {
    return next(timeout.plusSeconds(1));
  }

  /**
   * The next ID. {@code wait} bounds this draw: when it passes first, {@link
   * SeqException.DeadlineExceeded} is thrown and the fetch goes on for the other callers.
   *
   * @throws SeqException.Unavailable no range within the timeout (the last reason in the message)
   * @throws SeqException.Exhausted the sequence hands out no more IDs
   * @throws SeqException.Closed the sequence or its client was closed
   */
  public long next(Duration wait) {
    long deadline = System.nanoTime() + wait.toNanos();
    lock.lock();
    try {
      while (true) {
        if (closed) {
          throw new SeqException.Closed();
        }
        if (cur < end) {
          long id = cur;
          if (id == refillAt) {
            refillAt = 0;
            prefetch();
          }
          cur++;
          return id;
        }
        if (queued != null) {
          setCurrent(queued[0], queued[1]);
          queued = null;
          continue;
        }
        if (fetch == null) {
          startFetch(Math.max(fetchSize, waiting + 1), false);
        } else if (fetch.background && bufSize > 0) {
          // ran dry while the prefetch was in flight: ask for (much) more next time
          fetch.background = false;
          fetchSize = Math.min(maxFetch, fetchSize * 4);
        }
        Fetch call = fetch;
        waiting++;
        try {
          while (!call.done && !closed) {
            long left = deadline - System.nanoTime();
            if (left <= 0) {
              throw new SeqException.DeadlineExceeded("no ID of '" + name + "' within " + wait);
            }
            changed.awaitNanos(left);
          }
        } catch (InterruptedException e) {
          Thread.currentThread().interrupt();
          throw new SeqException.Unavailable("interrupted while waiting for an ID of '" + name + "'");
        } finally {
          waiting--;
        }
        if (call.error != null && cur >= end && queued == null && !closed) {
          throw call.error;
        }
      }
    } finally {
      lock.unlock();
    }
  }

  /** Stops fetching; waiting callers get {@link SeqException.Closed}. Idempotent. */
  @Override
  public void close() {
    lock.lock();
    try {
      if (closed) {
        return;
      }
      closed = true;
      cur = end = 0;
      queued = null;
      changed.signalAll();
    } finally {
      lock.unlock();
    }
    client.forget(this);
  }

  boolean isClosed() {
    return closed;
  }

  private void setCurrent(long lo, long hi) {
    cur = lo;
    end = hi;
    start = lo;
    refillAt = bufSize > 0 ? Math.max(lo, hi - 1 - (hi - lo) / 2) : 0;
  }

  private void prefetch() {
    if (fetch == null && queued == null && !closed) {
      startFetch(fetchSize, true);
    }
  }

  private void startFetch(long n, boolean background) {
    Fetch call = new Fetch();
    call.background = background;
    fetch = call;
    try {
      client.submit(() -> run(call, n));
    } catch (RuntimeException e) { // the client's executor is shut down: the client was closed
      fetch = null;
      call.done = true;
      call.error = new SeqException.Closed();
    }
  }

  private void run(Fetch call, long n) {
    RuntimeException error = null;
    long[] range = null;
    try {
      range = client.fetch(name, n, timeout, attemptTimeout, this);
    } catch (RuntimeException e) {
      error = e;
    } catch (InterruptedException e) {
      error = new SeqException.Closed();
    }
    lock.lock();
    try {
      if (range != null && !closed) {
        error = install(range[0], range[1]);
      }
      call.error = error;
      call.done = true;
      fetch = null;
      changed.signalAll();
    } finally {
      lock.unlock();
    }
  }

  private RuntimeException install(long lo, long hi) {
    if (lo < high || hi <= lo) {
      return new SeqException.Inconsistent("range [" + lo + ", " + hi + ") is below ID " + (high - 1)
          + " already obtained");
    }
    high = hi;
    if (cur < end) {
      long left = end - cur;
      long size = end - start;
      if (left * 4 > size) {
        fetchSize = Math.max(bufSize, fetchSize / 2);
      } else if (left * 16 < size && bufSize > 0) {
        fetchSize = Math.min(maxFetch, fetchSize * 2);
      }
      queued = new long[] {lo, hi};
      return null;
    }
    setCurrent(lo, hi);
    return null;
  }
}
