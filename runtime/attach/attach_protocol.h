// The messages between `runner attach` and a training process (docs/architecture.md, "runner attach"): each is a
// header line "KIND LENGTH\n" and LENGTH bytes of text, so that chunks and output may hold any bytes.
#pragma once

#include <cstddef>
#include <optional>
#include <stdexcept>
#include <string>

namespace runner::attach {

// What a message is. From the client: eval (a chunk), complete (text to complete), interrupt (stop the running
// chunk: Ctrl-C), detach. From the training process: hello (the banner), busy (another client is attached),
// output (what the chunk printed), done (the chunk ran), error (its error and traceback), incomplete (the chunk
// needs more lines), syntax_error (the compiler's message), completions (one per line), disconnected (the client
// was idle too long; why), ended (the run ended; why).
struct Message {
  std::string kind;
  std::string text;
};

// A header that is not "KIND LENGTH\n" (KIND: 1 to 16 lower-case letters or '_') or a length over kMaxMessageBytes.
struct ProtocolError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

inline constexpr std::size_t kMaxMessageBytes = std::size_t{64} << 20;

std::string encode_message(const Message& message);

// Splits a byte stream into messages, whatever pieces it arrives in.
class MessageReader {
 public:
  void feed(const char* bytes, std::size_t count) { buffer_.append(bytes, count); }
  // The next whole message, if it has arrived. Throws ProtocolError.
  std::optional<Message> next();

 private:
  std::string buffer_;
};

}  // namespace runner::attach
