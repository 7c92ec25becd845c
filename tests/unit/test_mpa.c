/* test_mpa.c - placeholder, filled below */
#include <criterion/criterion.h>
Test(mpa, placeholder) {}
