package juggler.seq;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;

import org.junit.jupiter.api.Test;

class SnowflakeTest {
  // the same vectors as the Python decoder (seq.snowflake.decode) gives
  @Test
  void decodesLikeTheWorkers() {
    Snowflake.Decoded d = Snowflake.decode(517815306035199L, Snowflake.Layout.DEFAULT);
    assertEquals("2024-01-02T10:17:36.789Z", d.time().toString());
    assertEquals(123456789L, d.ms());
    assertEquals(513, d.worker());
    assertEquals(4095, d.sequence());
    Snowflake.Decoded top = Snowflake.decode(Long.MAX_VALUE, Snowflake.Layout.DEFAULT);
    assertEquals("2093-09-06T15:47:35.551Z", top.time().toString());
    assertEquals(2199023255551L, top.ms());
    assertEquals(1023, top.worker());
    assertEquals("2024-01-01T00:00:00Z", Snowflake.decode(1, Snowflake.Layout.DEFAULT).time().toString());
  }

  @Test
  void otherLayouts() {
    Snowflake.Layout l = new Snowflake.Layout(0, 39, 16, 8);
    long ms = 1L << 38;
    Snowflake.Decoded d = Snowflake.decode((ms << 24) | (65535L << 8) | 7, l);
    assertEquals(ms, d.ms());
    assertEquals(65535, d.worker());
    assertEquals(7, d.sequence());
  }

  @Test
  void refusesBadInput() {
    assertThrows(IllegalArgumentException.class, () -> Snowflake.decode(-1, Snowflake.Layout.DEFAULT));
    assertThrows(IllegalArgumentException.class, () -> new Snowflake.Layout(0, 41, 10, 13));
    assertThrows(IllegalArgumentException.class, () -> new Snowflake.Layout(0, 31, 10, 22));
    assertThrows(IllegalArgumentException.class, () -> new Snowflake.Layout(0, 41, 0, 22));
    assertThrows(IllegalArgumentException.class, () -> new Snowflake.Layout(-1, 41, 10, 12));
  }
}
