#include <criterion/criterion.h>
Test(placeholder, none) { cr_assert(1); }
