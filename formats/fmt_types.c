/*
 * formats/fmt_types.c - the HDF5 file type of each dtype (contract section 3), the checksum
 * (XXH3-64), and HDF5's error printing turned off for the library's threads.
 *
 * f16 and bf16 are built from IEEE f32 with their own fields: f16 is sign 15, exponent
 * 10..14 (bias 15), mantissa 0..9; bf16 is sign 15, exponent 7..14 (bias 127), mantissa
 * 0..6, i.e. the upper half of an f32.
 */
#include <xxhash.h>

#include "fmt.h"

static hid_t float16(int epos, int esize, int msize, unsigned bias)
{
    hid_t t = H5Tcopy(H5T_IEEE_F32LE);
    if (t < 0)
        return -1;
    if (H5Tset_fields(t, 15, (size_t)epos, (size_t)esize, 0, (size_t)msize) < 0 || H5Tset_offset(t, 0) < 0 ||
        H5Tset_precision(t, 16) < 0 || H5Tset_size(t, 2) < 0 || H5Tset_ebias(t, bias) < 0) {
        H5Tclose(t);
        return -1;
    }
    return t;
}

hid_t fmt_h5_type(rk_dtype dtype)
{
    switch (dtype) {
    case RK_F32: return H5Tcopy(H5T_IEEE_F32LE);
    case RK_F64: return H5Tcopy(H5T_IEEE_F64LE);
    case RK_F16: return float16(10, 5, 10, 15);
    case RK_BF16: return float16(7, 8, 7, 127);
    case RK_I32: return H5Tcopy(H5T_STD_I32LE);
    case RK_I64: return H5Tcopy(H5T_STD_I64LE);
    case RK_U8: return H5Tcopy(H5T_STD_U8LE);
    }
    return -1;
}

int fmt_dtype_of(hid_t type, rk_dtype *out)
{
    static const rk_dtype all[] = {RK_F32, RK_F64, RK_F16, RK_BF16, RK_I32, RK_I64, RK_U8};
    for (size_t i = 0; i < RK_ARRAY_LEN(all); i++) {
        hid_t t = fmt_h5_type(all[i]);
        if (t < 0)
            return RK_E_HDF5;
        htri_t eq = H5Tequal(t, type);
        H5Tclose(t);
        if (eq > 0) {
            *out = all[i];
            return 0;
        }
    }
    return RK_E_FORMAT;
}

void fmt_h5_quiet(void)
{
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
}

uint64_t fmt_xxh3(const void *p, size_t n)
{
    return XXH3_64bits(p, n);
}
