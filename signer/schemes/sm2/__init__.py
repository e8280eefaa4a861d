"""SM2 with SM3 (GB/T 32918.2-2016): the scheme (`scheme`), the public API (`api`) and private backends."""
