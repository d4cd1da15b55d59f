// CUDA's vector types with the device's alignment (2- and 4-wide aligned to their size,
// 3-wide to the element), and their make_* constructors. Generated once; edit freely.
#pragma once

struct __attribute__((aligned(1))) char1 { char x; };
static inline char1 make_char1(char x) { return char1{x}; }
struct __attribute__((aligned(2))) char2 { char x, y; };
static inline char2 make_char2(char x, char y) { return char2{x, y}; }
struct __attribute__((aligned(1))) char3 { char x, y, z; };
static inline char3 make_char3(char x, char y, char z) { return char3{x, y, z}; }
struct __attribute__((aligned(4))) char4 { char x, y, z, w; };
static inline char4 make_char4(char x, char y, char z, char w) { return char4{x, y, z, w}; }
struct __attribute__((aligned(1))) uchar1 { unsigned char x; };
static inline uchar1 make_uchar1(unsigned char x) { return uchar1{x}; }
struct __attribute__((aligned(2))) uchar2 { unsigned char x, y; };
static inline uchar2 make_uchar2(unsigned char x, unsigned char y) { return uchar2{x, y}; }
struct __attribute__((aligned(1))) uchar3 { unsigned char x, y, z; };
static inline uchar3 make_uchar3(unsigned char x, unsigned char y, unsigned char z) { return uchar3{x, y, z}; }
struct __attribute__((aligned(4))) uchar4 { unsigned char x, y, z, w; };
static inline uchar4 make_uchar4(unsigned char x, unsigned char y, unsigned char z, unsigned char w) { return uchar4{x, y, z, w}; }
struct __attribute__((aligned(2))) short1 { short x; };
static inline short1 make_short1(short x) { return short1{x}; }
struct __attribute__((aligned(4))) short2 { short x, y; };
static inline short2 make_short2(short x, short y) { return short2{x, y}; }
struct __attribute__((aligned(2))) short3 { short x, y, z; };
static inline short3 make_short3(short x, short y, short z) { return short3{x, y, z}; }
struct __attribute__((aligned(8))) short4 { short x, y, z, w; };
static inline short4 make_short4(short x, short y, short z, short w) { return short4{x, y, z, w}; }
struct __attribute__((aligned(2))) ushort1 { unsigned short x; };
static inline ushort1 make_ushort1(unsigned short x) { return ushort1{x}; }
struct __attribute__((aligned(4))) ushort2 { unsigned short x, y; };
static inline ushort2 make_ushort2(unsigned short x, unsigned short y) { return ushort2{x, y}; }
struct __attribute__((aligned(2))) ushort3 { unsigned short x, y, z; };
static inline ushort3 make_ushort3(unsigned short x, unsigned short y, unsigned short z) { return ushort3{x, y, z}; }
struct __attribute__((aligned(8))) ushort4 { unsigned short x, y, z, w; };
static inline ushort4 make_ushort4(unsigned short x, unsigned short y, unsigned short z, unsigned short w) { return ushort4{x, y, z, w}; }
struct __attribute__((aligned(4))) int1 { int x; };
static inline int1 make_int1(int x) { return int1{x}; }
struct __attribute__((aligned(8))) int2 { int x, y; };
static inline int2 make_int2(int x, int y) { return int2{x, y}; }
struct __attribute__((aligned(4))) int3 { int x, y, z; };
static inline int3 make_int3(int x, int y, int z) { return int3{x, y, z}; }
struct __attribute__((aligned(16))) int4 { int x, y, z, w; };
static inline int4 make_int4(int x, int y, int z, int w) { return int4{x, y, z, w}; }
struct __attribute__((aligned(4))) uint1 { unsigned int x; };
static inline uint1 make_uint1(unsigned int x) { return uint1{x}; }
struct __attribute__((aligned(8))) uint2 { unsigned int x, y; };
static inline uint2 make_uint2(unsigned int x, unsigned int y) { return uint2{x, y}; }
static inline uint3 make_uint3(unsigned int x, unsigned int y, unsigned int z) { return uint3{x, y, z}; }
struct __attribute__((aligned(16))) uint4 { unsigned int x, y, z, w; };
static inline uint4 make_uint4(unsigned int x, unsigned int y, unsigned int z, unsigned int w) { return uint4{x, y, z, w}; }
struct __attribute__((aligned(8))) long1 { long x; };
static inline long1 make_long1(long x) { return long1{x}; }
struct __attribute__((aligned(16))) long2 { long x, y; };
static inline long2 make_long2(long x, long y) { return long2{x, y}; }
struct __attribute__((aligned(8))) long3 { long x, y, z; };
static inline long3 make_long3(long x, long y, long z) { return long3{x, y, z}; }
struct __attribute__((aligned(8))) ulong1 { unsigned long x; };
static inline ulong1 make_ulong1(unsigned long x) { return ulong1{x}; }
struct __attribute__((aligned(16))) ulong2 { unsigned long x, y; };
static inline ulong2 make_ulong2(unsigned long x, unsigned long y) { return ulong2{x, y}; }
struct __attribute__((aligned(8))) ulong3 { unsigned long x, y, z; };
static inline ulong3 make_ulong3(unsigned long x, unsigned long y, unsigned long z) { return ulong3{x, y, z}; }
struct __attribute__((aligned(8))) longlong1 { long long x; };
static inline longlong1 make_longlong1(long long x) { return longlong1{x}; }
struct __attribute__((aligned(16))) longlong2 { long long x, y; };
static inline longlong2 make_longlong2(long long x, long long y) { return longlong2{x, y}; }
struct __attribute__((aligned(8))) longlong3 { long long x, y, z; };
static inline longlong3 make_longlong3(long long x, long long y, long long z) { return longlong3{x, y, z}; }
struct __attribute__((aligned(8))) ulonglong1 { unsigned long long x; };
static inline ulonglong1 make_ulonglong1(unsigned long long x) { return ulonglong1{x}; }
struct __attribute__((aligned(16))) ulonglong2 { unsigned long long x, y; };
static inline ulonglong2 make_ulonglong2(unsigned long long x, unsigned long long y) { return ulonglong2{x, y}; }
struct __attribute__((aligned(8))) ulonglong3 { unsigned long long x, y, z; };
static inline ulonglong3 make_ulonglong3(unsigned long long x, unsigned long long y, unsigned long long z) { return ulonglong3{x, y, z}; }
struct __attribute__((aligned(4))) float1 { float x; };
static inline float1 make_float1(float x) { return float1{x}; }
struct __attribute__((aligned(8))) float2 { float x, y; };
static inline float2 make_float2(float x, float y) { return float2{x, y}; }
struct __attribute__((aligned(4))) float3 { float x, y, z; };
static inline float3 make_float3(float x, float y, float z) { return float3{x, y, z}; }
struct __attribute__((aligned(16))) float4 { float x, y, z, w; };
static inline float4 make_float4(float x, float y, float z, float w) { return float4{x, y, z, w}; }
struct __attribute__((aligned(8))) double1 { double x; };
static inline double1 make_double1(double x) { return double1{x}; }
struct __attribute__((aligned(16))) double2 { double x, y; };
static inline double2 make_double2(double x, double y) { return double2{x, y}; }
struct __attribute__((aligned(8))) double3 { double x, y, z; };
static inline double3 make_double3(double x, double y, double z) { return double3{x, y, z}; }

