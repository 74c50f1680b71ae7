"""Benchmarks: what floodwall costs against a direct connection and a plain byte pump."""
