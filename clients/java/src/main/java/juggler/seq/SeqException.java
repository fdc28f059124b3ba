package juggler.seq;

/** Base of the errors a {@link Sequence} raises. */
public class SeqException extends RuntimeException {
  public SeqException(String message) {
    super(message);
  }

  public SeqException(String message, Throwable cause) {
    super(message, cause);
  }

  /** No member gave a range in time: every member down, cut from a quorum, or removed. */
  public static class Unavailable extends SeqException {
    public Unavailable(String message) {
      super(message);
    }
  }

  /** The caller's own deadline for one draw passed first; the fetch goes on for the others. */
  public static class DeadlineExceeded extends Unavailable {
    public DeadlineExceeded(String message) {
      super(message);
    }
  }

  /** The sequence reached its largest ID and hands out no more. */
  public static class Exhausted extends SeqException {
    public Exhausted(String message) {
      super(message);
    }
  }

  /** The sequence or its client was closed. */
  public static class Closed extends SeqException {
    public Closed() {
      super("sequence is closed");
    }
  }

  /** A member answered a range below an ID already handed out (a cluster that lost state): refused. */
  public static class Inconsistent extends SeqException {
    public Inconsistent(String message) {
      super(message);
    }
  }
}
