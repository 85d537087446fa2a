"""The number formats parts are kept and computed in: the config's data types as torch dtypes (`dtypes`), frozen
weights quantized by their weight dtype (`quantize`: FLOAT_8, the 8-bit kinds, NFLOAT_4), a transformer's GGUF blocks
(`gguf_weights`), the compressed 8-bit kinds' codecs (`weight_codecs`) and SVDQuant's low-rank split (`svd_quant`).

Layering: above the config, whose `DataType` it reads, and below the weights, families, methods and trainer that use
it. It never reads the config itself: `quantize_part` takes the part's weight dtype and a `QuantizationSettings`,
built once per load from the config (`families/loading.quantization_settings`).
"""
