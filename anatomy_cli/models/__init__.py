"""Where a model comes from and what its files hold: resolve, hub, presets, spec (ModelSpec),
model_files (config, tokenizer), headers (GGUF, safetensors), adapters, bigmodel (placement).

May import text, errors and units; never engine, analyses, serve, corpus, output or cli.
"""
