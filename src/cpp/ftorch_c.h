/* ftorch_c.h - the C API of FTorch: umbrella header, includes one header per concern. */
#ifndef FTORCH_C_H
#define FTORCH_C_H

#include "ftorch_c_runtime.h"
#include "ftorch_c_tensor.h"
#include "ftorch_c_math.h"
#include "ftorch_c_autograd.h"
#include "ftorch_c_arglist.h"
#include "ftorch_c_model.h"
#include "ftorch_c_optim.h"
#include "ftorch_c_loss.h"
#include "ftorch_c_train.h"
#include "ftorch_c_function.h"
#include "ftorch_c_functional.h"
#include "ftorch_c_distributed.h"
#include "ftorch_c_python.h"

#endif
