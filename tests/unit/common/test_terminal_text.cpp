// terminal_text (common/terminal_text.hpp): nothing that could drive a
// terminal survives it, and ordinary text is left alone.
#include "common/terminal_text.hpp"

#include <gtest/gtest.h>

#include <string>

namespace fedwan {
namespace {

TEST(TerminalText, PlainTextAndValidUtf8AreKept) {
  EXPECT_EQ(terminal_text("site-1 member"), "site-1 member");
  EXPECT_EQ(terminal_text("Z\xc3\xbcrich \xe2\x82\xac \xf0\x9f\x9a\x80"),
            "Z\xc3\xbcrich \xe2\x82\xac \xf0\x9f\x9a\x80");
  EXPECT_EQ(terminal_text("a\\x1b"), "a\\x1b");  // a backslash is shown as is
}

TEST(TerminalText, ControlsAreEscaped) {
  EXPECT_EQ(terminal_text("\x1b[2J\x1b]0;pwned\x07"), "\\x1b[2J\\x1b]0;pwned\\x07");
  EXPECT_EQ(terminal_text("a\nb\rc\td"), "a\\x0ab\\x0dc\\x09d");
  EXPECT_EQ(terminal_text(std::string("a\0b", 3)), "a\\x00b");
  EXPECT_EQ(terminal_text("\x7f"), "\\x7f");
  // C1 controls as UTF-8 (U+009B is a one-character CSI on some terminals).
  EXPECT_EQ(terminal_text("\xc2\x9b"
                          "31m"),
            "\\u009b31m");
  EXPECT_EQ(terminal_text("\xc2\x80\xc2\x9f"), "\\u0080\\u009f");
}

TEST(TerminalText, BidiAndLineSeparatorsAreEscaped) {
  EXPECT_EQ(terminal_text("abc\xe2\x80\xae"
                          "fed"),
            "abc\\u202efed");
  EXPECT_EQ(terminal_text("\xe2\x81\xa6x\xe2\x81\xa9"), "\\u2066x\\u2069");
  EXPECT_EQ(terminal_text("\xe2\x80\x8f\xe2\x80\xa8\xd8\x9c"), "\\u200f\\u2028\\u061c");
}

TEST(TerminalText, InvalidUtf8IsEscapedByteByByte) {
  EXPECT_EQ(terminal_text("\xff\xfe"), "\\xff\\xfe");
  EXPECT_EQ(terminal_text("\x9b"), "\\x9b");                    // a raw 8-bit CSI
  EXPECT_EQ(terminal_text("\xc0\xaf"), "\\xc0\\xaf");           // overlong '/'
  EXPECT_EQ(terminal_text("\xed\xa0\x80"), "\\xed\\xa0\\x80");  // a surrogate
  EXPECT_EQ(terminal_text("\xe2\x82"), "\\xe2\\x82");           // truncated
  EXPECT_EQ(terminal_text("ok\xc3"), "ok\\xc3");
}

TEST(TerminalText, LongTextIsCutAtACharacter) {
  const std::string huge(100000, 'a');
  const std::string shown = terminal_text(huge, 10);
  EXPECT_EQ(shown, "aaaaaaaaaa...(100000 bytes)");
  // Never in the middle of a character.
  EXPECT_EQ(terminal_text("abc\xe2\x82\xac", 5), "abc...(6 bytes)");
  EXPECT_EQ(terminal_text("abcde", 5), "abcde");
}

}  // namespace
}  // namespace fedwan
