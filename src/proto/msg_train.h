/*
 * msg_train.h: the TRAIN message's codec (msg_train.c), private to
 * src/proto: msg.c's cm_msg_encode and cm_msg_decode call it. Same rules
 * as msg.c: bounded, overflow-checked, never allocates, never reads past n.
 */
#ifndef CM_MSG_TRAIN_H
#define CM_MSG_TRAIN_H

#include "proto.h"

/* Encode t into out (cap bytes; out NULL: measure only). *len gets the
 * payload's size, *over whether it did not fit. Returns the first field out
 * of its bounds, or NULL. */
const char *cm_msg_train_put(const cm_msg_train *t, uint8_t *out, size_t cap, size_t *len, bool *over);
/* Decode t from the n bytes at p, consuming *used of them. Returns the
 * first bad field (with *reason), or NULL. */
const char *cm_msg_train_take(const uint8_t *p, size_t n, cm_msg_train *t, size_t *used, const char **reason);

#endif
