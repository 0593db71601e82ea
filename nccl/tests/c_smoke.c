/* Calls weave's libnccl.so.2 through nccl/include/nccl.h as a C program would, without a GPU:
 * version, unique id, error strings, and an init that fails cleanly. Prints "c_smoke: ok". */
#include <stdio.h>
#include <string.h>
#include "nccl.h"

#define EXPECT(cond) do { if (!(cond)) { fprintf(stderr, "c_smoke: failed: %s (line %d)\n", #cond, __LINE__); return 1; } } while (0)

int main(void) {
  int version = 0;
  EXPECT(ncclGetVersion(&version) == ncclSuccess);
  EXPECT(version == NCCL_VERSION_CODE);
  EXPECT(ncclGetVersion(NULL) == ncclInvalidArgument);
  ncclUniqueId id;
  memset(&id, 0, sizeof id);
  EXPECT(ncclGetUniqueId(&id) == ncclSuccess);
  EXPECT(memcmp(id.internal, "WVNC", 4) == 0);
  EXPECT(strcmp(ncclGetErrorString(ncclSuccess), "no error") == 0);
  EXPECT(strlen(ncclGetErrorString(ncclRemoteError)) > 0);
  EXPECT(strcmp(ncclGetErrorString((ncclResult_t)42), "unknown result code") == 0);
  EXPECT(sizeof(ncclConfig_t) == 80);
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  ncclComm_t comm = (ncclComm_t)&config;
  ncclResult_t r = ncclCommInitRankConfig(&comm, 1, id, 0, &config);
  /* Without a GPU the init fails with a CUDA error code and leaves comm NULL. */
  EXPECT(r == ncclUnhandledCudaError || r == ncclInvalidUsage);
  EXPECT(comm == NULL);
  EXPECT(strlen(ncclGetLastError(NULL)) > 0);
  printf("c_smoke: init without a GPU: %s (%s)\n", ncclGetErrorString(r), ncclGetLastError(NULL));
  int count = 0;
  EXPECT(ncclCommCount(NULL, &count) == ncclInvalidArgument);
  EXPECT(ncclAllReduce(NULL, NULL, 0, ncclFloat, ncclSum, NULL, NULL) == ncclInvalidArgument);
  EXPECT(ncclGroupStart() == ncclSuccess);
  EXPECT(ncclGroupEnd() == ncclSuccess);
  EXPECT(ncclGroupEnd() == ncclInvalidUsage);
  printf("c_smoke: ok\n");
  return 0;
}
