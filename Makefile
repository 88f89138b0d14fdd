# Convenience wrapper around meson/ninja. `make` builds into build/.
BUILD ?= build
MESON_OPTS ?=

all: $(BUILD)/build.ninja
	ninja -C $(BUILD)

$(BUILD)/build.ninja:
	meson setup $(BUILD) $(MESON_OPTS)

# Sanitizer build one switch away: make asan
asan:
	meson setup build-asan -Db_sanitize=address,undefined -Dbuildtype=debug
	ninja -C build-asan

test: all
	tests/run

clean:
	rm -rf $(BUILD) build-asan

.PHONY: all asan test clean
