# The fleet drill's C load tools (bench/native_load.py): a stream client and a fake
# upstream that cost a few microseconds a chunk, so the drill's box spends its cores on
# the relay under test. Plain C (libc, epoll: Linux); `make test` builds them for the
# drill's short version.
NATIVE_DIR := .engines/bench-native
NATIVE_TOOLS := $(NATIVE_DIR)/sse_client $(NATIVE_DIR)/sse_upstream

.PHONY: bench-native
bench-native: $(NATIVE_TOOLS)
ENGINES += bench-native

$(NATIVE_DIR)/%: bench/native/%.c
	@mkdir -p $(NATIVE_DIR)
	$(CC) -O2 -Wall -Wextra -o $@ $<
