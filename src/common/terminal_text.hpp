// Text from elsewhere (a peer's HTTP answer, a log written by another
// process) made safe to print on a terminal: the one function every such
// string goes through before it reaches std::cout or std::cerr.
//
// Shown escaped, never raw: C0 controls and DEL as \xNN (ESC is \x1b, so no
// escape sequence can clear the screen, set the title or recolour text), C1
// controls (U+0080..U+009F) and the bidirectional and line-separator
// controls (U+061C, U+200E, U+200F, U+2028..U+202E, U+2066..U+2069) as
// \uNNNN, and every byte that is not part of valid UTF-8 as \xNN. Other
// valid UTF-8 is kept. The escapes are for a reader, not reversible: a
// backslash in the input is shown as is. Thread safe (pure).
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace fedwan {

// At most `max_bytes` of the input are shown (cut at a character boundary);
// a longer input ends in "...(N bytes)" with its full size.
std::string terminal_text(std::string_view text, size_t max_bytes = 4096);

}  // namespace fedwan
