# docs/examples/requantize.py: python docs/examples/requantize.py SOURCE.gguf OUT.gguf [TYPE]
# (TYPE: Q8_0, the default, Q4_0, Q4_1, Q5_0, Q5_1)
import sys
from pathlib import Path

import gguf
import numpy as np
from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType, GGUFWriter
from gguf.quants import dequantize, quantize


def requantize(src, out, type_name="Q8_0"):
    """Every matrix of src dequantized and quantized again as type_name; 1-D tensors (norms, biases) and rows
    that are not a whole number of blocks copied as they are; every metadata key copied, general.file_type set."""
    qtype = GGMLQuantizationType[type_name]
    block = gguf.GGML_QUANT_SIZES[qtype][0]
    reader = GGUFReader(src)
    writer = GGUFWriter(out, reader.fields["general.architecture"].contents())
    for field in reader.fields.values():
        if field.name.startswith("GGUF.") or field.name in ("general.architecture", "general.alignment",
                                                           "general.file_type"):
            continue  # the writer writes these itself
        vtype = field.types[0]
        writer.add_key_value(field.name, field.contents(), vtype,
                             sub_type=field.types[-1] if vtype == GGUFValueType.ARRAY else None)
    writer.add_file_type(getattr(gguf.LlamaFileType, f"MOSTLY_{type_name}"))
    for t in reader.tensors:
        if len(t.shape) == 1 or t.shape[0] % block:  # t.shape: GGUF order, the row length first
            if t.tensor_type in (GGMLQuantizationType.F32, GGMLQuantizationType.F16):
                writer.add_tensor(t.name, np.array(t.data), raw_dtype=t.tensor_type)
            else:
                writer.add_tensor(t.name, dequantize(t.data, t.tensor_type))
            continue
        writer.add_tensor(t.name, quantize(dequantize(t.data, t.tensor_type), qtype), raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


if __name__ == "__main__":
    source = sys.argv[1]
    if not Path(source).is_file():  # a --model name such as smollm2: anatomy says which file it is
        from anatomy_cli.models.resolve import check_path

        found = check_path(source)
        if found is None or found.kind != "gguf":
            sys.exit(f"error: {source} is not a GGUF file")
        source = found.ref
    requantize(source, sys.argv[2], sys.argv[3] if len(sys.argv) > 3 else "Q8_0")
    print(sys.argv[2])
