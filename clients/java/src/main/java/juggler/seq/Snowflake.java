package juggler.seq;

import java.time.Instant;

/**
 * Time-ordered IDs of seq's snowflake workers: from the top bit down, 0 | milliseconds since the
 * epoch | worker | sequence. Every worker and decoder of a deployment uses the same {@link Layout}.
 */
public final class Snowflake {
  private Snowflake() {}

  /** The bit split and epoch (Unix milliseconds) of a deployment's IDs; checked when made. */
  public record Layout(long epochMs, int timeBits, int workerBits, int sequenceBits) {
    /** The workers' default: 41/10/12 bits and the epoch 2024-01-01T00:00:00Z. */
    public static final Layout DEFAULT = new Layout(1704067200000L, 41, 10, 12);

    public Layout {
      if (timeBits + workerBits + sequenceBits != 63) {
        throw new IllegalArgumentException("time, worker and sequence bits must add up to 63, got "
            + timeBits + "+" + workerBits + "+" + sequenceBits);
      }
      if (timeBits < 32) {
        throw new IllegalArgumentException("time bits must be at least 32");
      }
      if (workerBits < 1 || workerBits > 16) {
        throw new IllegalArgumentException("worker bits must be from 1 to 16");
      }
      if (sequenceBits < 1 || sequenceBits > 22) {
        throw new IllegalArgumentException("sequence bits must be from 1 to 22");
      }
      if (epochMs < 0) {
        throw new IllegalArgumentException("the epoch must not be before 1970");
      }
    }
  }

  /** An ID split into its parts; {@code time} is when it was made (millisecond precision). */
  public record Decoded(long id, Instant time, long ms, int worker, int sequence) {}

  /** Splits {@code id} (0 to 2^63-1) made with {@code layout}. */
  public static Decoded decode(long id, Layout layout) {
    if (id < 0) {
      throw new IllegalArgumentException("an ID is an integer from 0 to 2**63-1");
    }
    int sequence = (int) (id & ((1L << layout.sequenceBits()) - 1));
    int worker = (int) ((id >>> layout.sequenceBits()) & ((1L << layout.workerBits()) - 1));
    long ms = id >>> (layout.workerBits() + layout.sequenceBits());
    return new Decoded(id, Instant.ofEpochMilli(layout.epochMs() + ms), ms, worker, sequence);
  }
}
