// Framing of the attach messages.
#include "runtime/attach/attach_protocol.h"

#include <fmt/format.h>

#include "runtime/core/terminal_text.h"

namespace runner::attach {
namespace {

constexpr std::size_t kMaxKindLength = 16;
constexpr std::size_t kMaxHeaderLength = kMaxKindLength + 1 + 20 + 1;

bool is_kind(const std::string& kind) {
  if (kind.empty() || kind.size() > kMaxKindLength) return false;
  for (char c : kind)
    if (!((c >= 'a' && c <= 'z') || c == '_')) return false;
  return true;
}

}  // namespace

std::string encode_message(const Message& message) {
  if (!is_kind(message.kind)) throw ProtocolError(fmt::format("bad message kind '{}'", message.kind));
  if (message.text.size() > kMaxMessageBytes)
    throw ProtocolError(fmt::format("a {} message of {} bytes is over the limit of {}", message.kind,
                                    message.text.size(), kMaxMessageBytes));
  return fmt::format("{} {}\n", message.kind, message.text.size()) + message.text;
}

std::optional<Message> MessageReader::next() {
  const std::size_t end = buffer_.find('\n');
  if (end == std::string::npos) {
    if (buffer_.size() > kMaxHeaderLength)
      throw ProtocolError("a message header is longer than " + std::to_string(kMaxHeaderLength) + " bytes");
    return std::nullopt;
  }
  const std::string header = buffer_.substr(0, end);
  const std::size_t space = header.find(' ');
  const std::string kind = header.substr(0, space);
  const std::string length_text = space == std::string::npos ? "" : header.substr(space + 1);
  const bool digits = !length_text.empty() && length_text.size() <= 20 &&
                      length_text.find_first_not_of("0123456789") == std::string::npos;
  if (!is_kind(kind) || !digits)
    throw ProtocolError(fmt::format("bad message header '{}' (expected 'KIND LENGTH')", core::terminal_text(header)));
  const unsigned long long length = std::stoull(length_text);
  if (length > kMaxMessageBytes)
    throw ProtocolError(
        fmt::format("a {} message of {} bytes is over the limit of {}", kind, length, kMaxMessageBytes));
  if (buffer_.size() - end - 1 < length) return std::nullopt;
  Message message{kind, buffer_.substr(end + 1, length)};
  buffer_.erase(0, end + 1 + length);
  return message;
}

}  // namespace runner::attach
