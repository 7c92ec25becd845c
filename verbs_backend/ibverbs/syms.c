/*
 * syms.c - loads libibverbs and librdmacm at the ibverbs provider's first open and fills the
 * table the provider calls them through (syms.h says why they are not linked).
 *
 * RTLD_LOCAL: nothing else in the process should bind to them through us. They are never
 * closed once loaded (libibverbs keeps provider plugins and per-device state for the life of
 * the process); a failed load closes what it opened, so a host without them maps nothing.
 */
#define IV_SYMS_NO_REDIRECT
#include "syms.h"

#include "env.h"

#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

struct iv_syms iv_sym;

static pthread_once_t load_once = PTHREAD_ONCE_INIT;
static int load_err;
static char load_why[200];

/* The file to dlopen: the soname, or the test/debug override in env. secure_getenv: a set-uid
 * program must not be made to load a library named by its caller. */
static const char *lib_name(enum dg_env env, const char *soname)
{
	const char *s = dg_env_str(env); /* secure_getenv (env.c) */
	return s ? s : soname;
}

static void load(void)
{
	const char *ibv_name = lib_name(DG_ENV_IBV_LIB, "libibverbs.so.1");
	const char *cm_name = lib_name(DG_ENV_RDMACM_LIB, "librdmacm.so.1");
	void *ibv = NULL, *cm = NULL;
	const char *lib = ibv_name, *sym = NULL, *ver = NULL, *err;
	/* libibverbs first: librdmacm needs it, and a missing libibverbs is the likelier story */
	if (!(ibv = dlopen(ibv_name, RTLD_NOW | RTLD_LOCAL)))
		goto fail;
	lib = cm_name;
	if (!(cm = dlopen(cm_name, RTLD_NOW | RTLD_LOCAL)))
		goto fail;
#define IV_SYM_LOAD(h, name, v)                                                                   \
	if (!(iv_sym.name = (__typeof__(iv_sym.name))dlvsym(h, #name, v))) {                      \
		sym = #name;                                                                      \
		ver = v;                                                                          \
		goto fail;                                                                        \
	}
	lib = ibv_name;
#define IV_SYM_IBV(name, v) IV_SYM_LOAD(ibv, name, v)
	IV_SYMS_IBVERBS(IV_SYM_IBV)
	lib = cm_name;
#define IV_SYM_CM(name, v) IV_SYM_LOAD(cm, name, v)
	IV_SYMS_RDMACM(IV_SYM_CM)
	return;
fail:
	err = dlerror();
	if (sym)
		snprintf(load_why, sizeof load_why, "%s has no %s@%s: %s", lib, sym, ver, err ? err : "?");
	else
		/* dlerror names the file: "libibverbs.so.1: cannot open shared object file: ..." */
		snprintf(load_why, sizeof load_why, "cannot load %s", err ? err : lib);
	if (cm)
		dlclose(cm);
	if (ibv)
		dlclose(ibv);
	memset(&iv_sym, 0, sizeof iv_sym);
	load_err = -ENODEV;
}

int iv_syms_load(char *why, size_t whylen)
{
	pthread_once(&load_once, load);
	if (load_err)
		snprintf(why, whylen, "%s", load_why);
	return load_err;
}
