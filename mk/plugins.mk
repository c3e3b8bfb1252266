# TorchServe frontend plugins (serving/plugins): the readiness /ping, which answers 200 only once
# every model has a worker that finished loading and warming up (docs/configuration.md, Readiness).
# make plugins    build/plugins/inf2-serving-plugins.jar (javac: apt-get install openjdk-17-jdk-headless)
# `make serve` and `make sagemaker-archive` build it; config.properties' plugins_path names its folder.
PLUGINS_DIR := $(BUILD)/plugins
PLUGINS_JAR := $(PLUGINS_DIR)/inf2-serving-plugins.jar
PLUGIN_SOURCES := $(shell find serving/plugins/src -type f 2>/dev/null)

.PHONY: plugins

plugins: $(PLUGINS_JAR)

$(PLUGINS_JAR): $(PLUGIN_SOURCES) scripts/serve/build_plugins.py | venv
	$(PY) -m scripts.serve.build_plugins --out $(PLUGINS_DIR) --force
