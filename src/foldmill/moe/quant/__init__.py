"""8-bit formats for the expert GEMMs: FP8 row-wise and OCP MXFP8 (E4M3 elements, E8M0 block scales)."""
