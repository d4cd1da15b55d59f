// Stand-in for <assert.h> in kernels (found before the system's through -I): a failed
// assert fails the launch with the expression and place, as CUDA's device-side assert
// does, instead of aborting the process. No include guard, as the standard's.
#undef assert
#ifdef NDEBUG
#define assert(e) ((void)0)
#else
#define assert(e) ((e) ? (void)0 : dcpemu_assert_fail(#e, __FILE__, __LINE__))
#endif
