# The layering rules that a grep can check (docs/architecture.md, "Layers"), run by ctest as "layers: ...":
#   cmake -DRUNNER_SOURCE_DIR=<root> -P tests/layers.cmake
# 1. Only bindings/ touches the Lua C API: app/ and runtime/ name no lua_* / luaL_ function, no lua_State, no
#    LUA_* / LUAJIT_* macro and include no Lua header (app/ reaches Lua through bindings/lua_host.h,
#    repl_session.h and sweep_file.h).
# 2. Process facts go through core::LaunchContext: app/, bindings/ and stdlib/ read no environment variable
#    (getenv, os.getenv) and nothing sets one (setenv) for the process to read back; in runtime/ only
#    core/launch_context.cpp reads a RUNNER_* variable.
# 3. Includes point down: runtime/ includes nothing of bindings/ or app/, bindings/ nothing of app/, and each folder
#    of runtime/ includes only its own headers and those of the folders below it (runtime_uses_<folder> here), so an
#    upward include (serve/ from cli/, cli/ or serve/ from report/) fails. A new folder gets its line here.
# 4. In runtime/diffusion/ Gaussian diffusion and flow matching stand side by side over the shared files: a file of
#    one family includes none of the other's headers, and a shared file (any other) includes neither's.
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

file(GLOB_RECURSE runtime_sources ${root}/runtime/*.cpp ${root}/runtime/*.h)
foreach(path ${runtime_sources})
  if(path STREQUAL "${root}/runtime/core/launch_context.cpp")
    continue()
  endif()
  file(STRINGS ${path} lines REGEX "getenv *\\( *\"RUNNER_")
  foreach(line ${lines})
    string(REPLACE "${root}/" "" relative ${path})
    list(APPEND failures "process facts go through core::LaunchContext: ${relative}: ${line}")
  endforeach()
endforeach()

# The folders of runtime/, each with the folders whose headers it may include (docs/architecture.md, "Layers").
set(runtime_uses_core "")
set(runtime_uses_kernels "")
set(runtime_uses_system "")
set(runtime_uses_attach core)
set(runtime_uses_data core)
set(runtime_uses_dist core)
set(runtime_uses_image core)
set(runtime_uses_index core)
set(runtime_uses_ckpt core index)
set(runtime_uses_sweep core index)
set(runtime_uses_nn core ckpt kernels)
set(runtime_uses_train core dist nn)
set(runtime_uses_diffusion core nn train)
set(runtime_uses_latents core data nn)
set(runtime_uses_eval core ckpt data nn)
set(runtime_uses_run core ckpt data dist image index nn system train)
set(runtime_uses_report core index sweep)
set(runtime_uses_cli core ckpt data eval index latents report sweep)
set(runtime_uses_serve core cli index report sweep)

file(GLOB_RECURSE runtime_files RELATIVE ${root}/runtime ${root}/runtime/*.cpp ${root}/runtime/*.h ${root}/runtime/*.cu
     ${root}/runtime/*.cuh)
if(NOT runtime_files)
  message(FATAL_ERROR "layers: no sources under ${root}/runtime: RUNNER_SOURCE_DIR must be the checkout's root")
endif()
foreach(relative ${runtime_files})
  if(NOT relative MATCHES "^([a-z_]+)/")
    continue()
  endif()
  set(folder ${CMAKE_MATCH_1})
  if(NOT DEFINED runtime_uses_${folder})
    list(APPEND failures "runtime/${folder}/ has no line in tests/layers.cmake: add set(runtime_uses_${folder} ...)")
    continue()
  endif()
  file(STRINGS ${root}/runtime/${relative} lines REGEX "^#include \"(app|bindings|runtime/[a-z_]+)/")
  foreach(line ${lines})
    string(REGEX MATCH "\"(app|bindings|runtime/([a-z_]+))/" included "${line}")
    if(CMAKE_MATCH_1 STREQUAL "app" OR CMAKE_MATCH_1 STREQUAL "bindings")
      list(APPEND failures "includes point down: runtime/${relative} includes ${CMAKE_MATCH_1}/: ${line}")
    elseif(NOT CMAKE_MATCH_2 STREQUAL folder AND NOT CMAKE_MATCH_2 IN_LIST runtime_uses_${folder})
      list(JOIN runtime_uses_${folder} ", " allowed)
      list(APPEND failures
           "includes point down: runtime/${relative} includes ${CMAKE_MATCH_2}/ (${folder}/ may use ${allowed}): ${line}")
    endif()
  endforeach()
endforeach()

set(diffusion_gaussian noise_schedule gaussian_diffusion diffusion_objective gaussian_sampler)
set(diffusion_flow flow flow_sampler)
file(GLOB diffusion_files RELATIVE ${root}/runtime/diffusion ${root}/runtime/diffusion/*.cpp ${root}/runtime/diffusion/*.h)
foreach(file ${diffusion_files})
  string(REGEX REPLACE "\\.(cpp|h)$" "" name ${file})
  set(family shared)
  foreach(candidate gaussian flow)
    if(name IN_LIST diffusion_${candidate})
      set(family ${candidate})
    endif()
  endforeach()
  file(STRINGS ${root}/runtime/diffusion/${file} lines REGEX "^#include \"runtime/diffusion/[a-z_]+\\.h\"")
  foreach(line ${lines})
    string(REGEX MATCH "runtime/diffusion/([a-z_]+)\\.h" included "${line}")
    foreach(other gaussian flow)
      if(NOT other STREQUAL family AND CMAKE_MATCH_1 IN_LIST diffusion_${other})
        list(APPEND failures "the diffusion families stand side by side: runtime/diffusion/${file} (${family}) includes "
                             "${other}'s ${CMAKE_MATCH_1}.h")
      endif()
    endforeach()
  endforeach()
endforeach()

file(GLOB_RECURSE bindings_files ${root}/bindings/*.cpp ${root}/bindings/*.h)
foreach(path ${bindings_files})
  file(STRINGS ${path} lines REGEX "^#include \"app/")
  foreach(line ${lines})
    string(REPLACE "${root}/" "" relative ${path})
    list(APPEND failures "includes point down: ${relative} includes app/: ${line}")
  endforeach()
endforeach()

if(failures)
  list(JOIN failures "\n" text)
  message(FATAL_ERROR "${text}")
endif()
message(STATUS "layers: app/ and runtime/ use no Lua C API; app/, bindings/ and stdlib/ read no environment (runtime/ no RUNNER_* variable but through the launch context); includes point down; the diffusion families side by side")
