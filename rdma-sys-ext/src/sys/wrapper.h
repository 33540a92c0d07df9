/* Input for scripts/gen-rdma-bindings.sh: everything rdma-sys-ext binds. */
#include <infiniband/verbs.h>
#include <infiniband/mlx5dv.h>
