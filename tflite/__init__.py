"""TFLite conversion (float32, float16, dynamic-range, int8) and LiteRT execution."""
