# The layering rules that a grep can check (docs/architecture.md, "Layers"), run by ctest as "layers: ...":
#   cmake -DRUNNER_SOURCE_DIR=<root> -P tests/layers.cmake
# 1. Only bindings/ touches the Lua C API: app/ and runtime/ name no lua_* / luaL_ function, no lua_State, no
#    LUA_* / LUAJIT_* macro and include no Lua header (app/ reaches Lua through bindings/lua_host.h,
#    repl_session.h and sweep_file.h).
# 2. Process facts go through core::LaunchContext: app/, bindings/ and stdlib/ read no environment variable
#    (getenv, os.getenv) and nothing sets one (setenv) for the process to read back.
cmake_minimum_required(VERSION 3.20)
set(root ${RUNNER_SOURCE_DIR})
set(failures "")

file(GLOB_RECURSE lua_free_files ${root}/app/*.cpp ${root}/app/*.h ${root}/runtime/*.cpp ${root}/runtime/*.h
     ${root}/runtime/*.cu ${root}/runtime/*.cuh)
foreach(path ${lua_free_files})
  file(STRINGS ${path} lines REGEX "(lua_[a-z]+ *\\(|luaL_|lua_State|LUA_[A-Z]|LUAJIT_[A-Z]|#include *[<\"](lua|lauxlib|lualib|luajit))")
  foreach(line ${lines})
    string(REPLACE "${root}/" "" relative ${path})
    list(APPEND failures "only bindings/ touches the Lua C API: ${relative}: ${line}")
  endforeach()
endforeach()

file(GLOB_RECURSE environment_free_files ${root}/app/*.cpp ${root}/app/*.h ${root}/bindings/*.cpp ${root}/bindings/*.h
     ${root}/stdlib/*.lua)
foreach(path ${environment_free_files})
  file(STRINGS ${path} lines REGEX "(getenv|setenv) *\\(")
  foreach(line ${lines})
    string(REPLACE "${root}/" "" relative ${path})
    list(APPEND failures "process facts go through core::LaunchContext: ${relative}: ${line}")
  endforeach()
endforeach()

if(failures)
  list(JOIN failures "\n" text)
  message(FATAL_ERROR "${text}")
endif()
message(STATUS "layers: app/ and runtime/ use no Lua C API; app/, bindings/ and stdlib/ read no environment")
