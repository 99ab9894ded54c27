//===- ApeDialect.h - the ape dialect -------------------------------------===//
#ifndef APE_DIALECT_APEDIALECT_H
#define APE_DIALECT_APEDIALECT_H

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Math/IR/Math.h"
#include "mlir/IR/Dialect.h"

#include "dialect/ApeDialect.h.inc"

#define GET_TYPEDEF_CLASSES
#include "dialect/ApeTypes.h.inc"

#endif // APE_DIALECT_APEDIALECT_H
