package juggler.seq.examples;

import java.time.Duration;
import java.util.Arrays;
import juggler.seq.SeqClient;
import juggler.seq.SeqException;
import juggler.seq.Sequence;

/**
 * Prints IDs of a sequence, one per line.
 *
 * <pre>mvn -q exec:java -Dexec.args="127.0.0.1:19001,127.0.0.1:19002,127.0.0.1:19003 orders 5"</pre>
 */
public final class Draw {
  private Draw() {}

  public static void main(String[] args) {
    if (args.length != 3) {
      System.err.println("usage: Draw SERVERS NAME COUNT   (SERVERS: HOST:PORT,...)");
      System.exit(2);
    }
    try (SeqClient client = SeqClient.builder(Arrays.asList(args[0].split(","))).build()) {
      // a fetch (fail-over included) may take up to 15 s; next() waits for it
      Sequence seq = client.sequence(args[1], Sequence.options().bufSize(100).timeout(Duration.ofSeconds(15)));
      for (int i = 0; i < Integer.parseInt(args[2]); i++) {
        System.out.println(seq.next());
      }
    } catch (SeqException e) {
      System.err.println("draw: " + e.getMessage());
      System.exit(1);
    }
  }
}
