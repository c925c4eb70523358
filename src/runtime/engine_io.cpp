// STUB: engine files (to be written).
#include "kiln/engine.h"
#include "kiln/errors.h"

namespace kiln {

Bytes Engine::serialize() const { KILN_FAIL(kUnsupported, "serialize not implemented yet"); }
std::shared_ptr<Engine> Engine::deserialize(const uint8_t*, size_t, const Device&) {
  KILN_FAIL(kUnsupported, "deserialize not implemented yet");
}
void Engine::save(const std::string&) const { KILN_FAIL(kUnsupported, "save not implemented yet"); }
std::shared_ptr<Engine> Engine::load(const std::string&, const Device&) { KILN_FAIL(kUnsupported, "load not implemented yet"); }

}  // namespace kiln
