"""Text and tokens: tokenization (the engine's tokenizer wrapper), display (how a token is shown),
encodings (tiktoken offline), inputs (prompts from arguments or stdin), targets, options (PromptOptions).

May import models, errors and units; never engine, analyses, serve, corpus, output or cli.
"""
